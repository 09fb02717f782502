"""The control plane's cost: the fleet around a model whose forward costs almost nothing.

On a GPU the model runs tens of times faster than on these cores, and then what surrounds
it (intake, claims, tokenization, result writes, fair share's refills, settling, the web
tier, the interactive protocol) decides throughput and cost. This benchmark measures that
part alone.

The model: a real BertModel with MiniLM's config and tokenizer but `num_hidden_layers=0`
(embeddings, pooling and 384-dim output only), built at run time in a temporary folder and
served in place of MiniLM through LANEWAY_MODEL_PATH. Every task runs the `minilm` model
by default (core/config/settings.py), so embed and classify both run it; every stage of
the pipeline still runs.

The fleet: real processes at default settings, as `laneway` starts them: the web app
(gunicorn), --workers `laneway worker cpu` processes and, on the fleet that serves the
interactive levels, one `laneway worker interactive`, on a database the run creates
(dropped at the end) and a Redis db index it claims the way the test suite does. The
batch lanes' broker is whatever LANEWAY_BROKER_URL names, else that Redis;
`--brokers redis,rabbitmq` measures both, one after the other, each with a fleet,
database and Redis db index of its own, RabbitMQ's on a fresh vhost of the node
LANEWAY_BENCH_RABBITMQ names (amqp://guest:guest@127.0.0.1:5672 unless set; rabbitmqctl
makes and deletes it). The interactive path stays on Redis whatever the batch broker.

1. Batch: on each broker, for each task, one --items job through `POST /v1/jobs` (JSON),
   polled until its final status: items/s from the POST to the final status, every
   item's one result checked, and each tier's CPU per 1,000 items. Before it, a --warmup
   job of the same task, not measured: a fleet sizes a job's chunks from the speed its
   lane measured on that task's earlier chunks (jobs/planner.chunk_size_for), as a fleet
   that has served the task before does; `chunk_size` says what the measured job got.
2. Interactive, on the first broker's fleet: one-text `POST /v1/embed` requests from each
   --clients level for --seconds, each client on its own keep-alive connection:
   requests/s, p50/p99, and each tier's CPU per request; from the Python clients, the
   slowest 1 %'s stages too (their Server-Timing). The load generator shares the fleet's
   cores, and Python's threads (the default) take a share of them that no user's clients
   take from a server: `--load python,wrk` runs each level again from wrk, a C load
   generator (Debian's), with the same requests (as `interactive.wrk.<clients>`).

CPU is read from the processes' own counters (/proc/<pid>/stat: user + system of each
process, its living descendants and the children it reaped): web, the cpu workers, the
interactive worker, Postgres (the fleet's database's backends and the server's own
background processes), Redis (the redis-server process; shared with anything else using
it), on RabbitMQ the node's Erlang VM (beam.smp; shared with every vhost and anything
else using the node), and this process (the client). Tokenization alone is the job's
texts through the workers' own `prepare` (inference/batching.py) in this process;
`worker_outside_model` is the cpu workers' CPU less the job's model stage seconds.

The --json report (format 2) holds each broker's jobs as `brokers.<broker>.batch.<task>`
and the interactive levels as `interactive.<clients>`; the output ends with each broker's
figures, one broker after the other.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from bench.latency import Texts

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

BIN = Path(sys.executable).parent
ADMIN_PG = os.environ.get("LANEWAY_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_HOST = os.environ.get("LANEWAY_BENCH_REDIS", "redis://127.0.0.1:6379")
# The node whose fresh vhosts carry the batch lanes of `--brokers rabbitmq`.
RABBITMQ = os.environ.get("LANEWAY_BENCH_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672")
BROKERS = ("redis", "rabbitmq")
CLK_TCK = os.sysconf("SC_CLK_TCK")
FINAL = ("succeeded", "partial", "failed", "cancelled")


# --- the processes' own CPU counters ---------------------------------------------------


def stat_seconds(pid: int, reaped: bool = True) -> float:
    """User + system CPU seconds of `pid` from /proc/<pid>/stat, with its reaped children's
    (cutime, cstime) when `reaped`; 0.0 once the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / CLK_TCK


def descendants(pid: int) -> list[int]:
    """`pid` and every living process below it."""
    import psutil

    try:
        return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def tree_seconds(pid: int) -> dict[int, float]:
    return {p: stat_seconds(p) for p in descendants(pid)}


def postgres_pids(admin: str, database: str) -> list[int]:
    """This run's database's backends and the server's own processes (checkpointer, WAL
    writer, background writer, autovacuum): what the benchmark's writes cost Postgres."""
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s"
            " OR (datname IS NULL AND backend_type <> 'client backend')",
            (database,),
        ).fetchall()
    return [pid for (pid,) in rows]


def rabbitmq_pid(url: str) -> int | None:
    """The local RabbitMQ node's Erlang VM (beam.smp, started with `-s rabbit boot`), found
    in /proc; None when `url` names another machine. Where several nodes run here (a
    test's private one), the one listening on `url`'s port."""
    from bench.latency import LOCAL_HOSTS, local_listener

    if urlsplit(url).hostname not in LOCAL_HOSTS:
        return None
    nodes = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # it ended meanwhile
            continue
        if b"beam.smp" in cmdline and b"-s rabbit boot" in cmdline:
            nodes.append(int(entry.name))
    listening = local_listener(url, 5672)
    if listening in nodes:
        return listening
    # Another user's sockets show no pid: the only node then.
    return nodes[0] if len(nodes) == 1 else None


class Meter:
    """Each tier's CPU seconds between two readings, by the processes' own counters."""

    def __init__(self, tiers: dict[str, list[int]], admin: str, database: str) -> None:
        self.tiers, self.admin, self.database = tiers, admin, database

    def read(self) -> dict[str, dict[int, float]]:
        out = {name: {} for name in self.tiers}
        for name, roots in self.tiers.items():
            for root in roots:
                out[name].update(tree_seconds(root))
        out["postgres"] = {
            p: stat_seconds(p, reaped=False) for p in postgres_pids(self.admin, self.database)
        }
        # This process: its threads are the clients; it starts no child meanwhile.
        out["client"] = {os.getpid(): sum(os.times()[:2])}
        return out

    @staticmethod
    def spent(before: dict, after: dict) -> dict[str, float]:
        """Seconds per tier; a process that started in between counts from zero, one that
        ended in between is lost (pooled connections and workers live through a run)."""
        return {
            name: sum(s - before.get(name, {}).get(p, 0.0) for p, s in pids.items())
            for name, pids in after.items()
        }


# --- where the time goes (--profile) ------------------------------------------------------


class Profile:
    """py-spy sampling each tier's process tree during a batch job or an interactive level
    (raw stacks, one file per tier), and Postgres' own statement log for this run's database
    (every statement's duration: pg_stat_statements needs a server restart to load, this
    does not)."""

    PG_LOG = Path(
        os.environ.get("LANEWAY_BENCH_PG_LOG", "/var/log/postgresql/postgresql-15-main.log")
    )

    def __init__(self, folder: Path, admin: str, database: str) -> None:
        self.folder, self.admin, self.database = folder, admin, database
        folder.mkdir(parents=True, exist_ok=True)
        self.spies: list[subprocess.Popen] = []

    def log_statements(self) -> None:
        """Log every statement of this run's database from its next session on."""
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{self.database}" SET log_min_duration_statement = 0')

    def start(
        self,
        task: str,
        tiers: dict[str, list[int]],
        python: tuple[str, ...] = ("web", "cpu_workers"),
    ) -> None:
        """Sample the `python` tiers. py-spy reads Python only; a batch job leaves the idle
        interactive worker out (its 32 threads cost the sampler more than the worker costs
        the job)."""
        self.log_from = self.PG_LOG.stat().st_size if self.PG_LOG.exists() else 0
        spy = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")
        if spy is None:
            raise SystemExit("--profile needs py-spy (pip install py-spy: the dev extra)")
        for name, pids in tiers.items():
            for pid in pids if name in python else ():
                out = self.folder / f"{task}-{name}-{pid}.txt"
                argv = [spy, "record", "--pid", str(pid), "--subprocesses", "--rate", "47",
                        "--format", "raw", "--output", str(out), "--nonblocking"]  # fmt: skip
                if name == "web":
                    # Pure Python whose threads mostly wait (Redis, sockets): only samples
                    # holding the GIL, its CPU. The workers' torch releases the GIL.
                    argv.append("--gil")
                self.spies.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL))  # fmt: skip

    def stop(self, task: str) -> dict:
        for spy in self.spies:
            spy.send_signal(signal.SIGINT)
        for spy in self.spies:
            spy.wait(60)
        self.spies = []
        return {"statements_ms": self.statements()}

    def statements(self) -> dict[str, float]:
        """Milliseconds per statement shape (its first 90 characters, numbers dropped) this
        run's database logged since `start`, the costliest 12."""
        import re

        if not self.PG_LOG.exists():
            return {}
        with self.PG_LOG.open("rb") as fh:
            fh.seek(self.log_from)
            text = fh.read().decode(errors="replace")
        totals: dict[str, float] = {}
        marker = re.compile(r"duration: ([0-9.]+) ms  (?:statement|execute [^:]*): (.*)")
        for line in text.splitlines():
            if f"@{self.database} " not in line:
                continue
            found = marker.search(line)
            if found:
                shape = re.sub(r"\$?[0-9]+", "N", found.group(2))[:90]
                totals[shape] = totals.get(shape, 0.0) + float(found.group(1))
        top = sorted(totals.items(), key=lambda kv: -kv[1])[:12]
        return {k: round(v, 1) for k, v in top}


# --- the services and the near-free model ---------------------------------------------


def create_database(admin: str) -> tuple[str, str]:
    import psycopg

    name = f"laneway_cp_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return name, f"{base}/{name}"


def drop_database(admin: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def claim_redis_index() -> int:
    """A Redis db index no test run or other benchmark holds (the test suite's claim key)."""
    import redis

    r = redis.Redis.from_url(f"{REDIS_HOST}/0")
    for index in range(1, 16):
        if r.set(f"laneway:test-db:{index}", f"controlplane {os.getpid()}", nx=True, ex=3 * 3600):
            return index
    raise SystemExit("every Redis db index 1..15 is claimed")


def release_redis_index(index: int) -> None:
    import redis

    redis.Redis.from_url(f"{REDIS_HOST}/{index}").flushdb()
    redis.Redis.from_url(f"{REDIS_HOST}/0").delete(f"laneway:test-db:{index}")


def rabbitmqctl(*args: str) -> None:
    done = subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=60)
    if done.returncode:
        raise SystemExit(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip()}")


@contextmanager
def batch_broker(name: str) -> Iterator[str]:
    """The LANEWAY_BROKER_URL of `name`'s fleet: empty for Redis (the run's Redis db index
    carries the batch lanes too); for RabbitMQ a vhost of its own on the node RABBITMQ
    names, deleted afterwards, so that no queue or message of another run is there."""
    if name == "redis":
        yield ""
        return
    if shutil.which("rabbitmqctl") is None:
        raise SystemExit("--brokers rabbitmq makes a vhost with rabbitmqctl: not on PATH")
    vhost = f"laneway-cp-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        user = urlsplit(RABBITMQ).username or "guest"
        rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        yield f"{RABBITMQ.rstrip('/')}/{vhost}"
    finally:
        rabbitmqctl("delete_vhost", vhost)


def build_free_model(folder: Path) -> Path:
    """MiniLM's tokenizer and config with no encoder layer: the forward is the embedding
    lookup and the pooling, so the control plane is nearly all that costs."""
    from transformers import AutoConfig, AutoTokenizer, BertModel

    from inference.encoder import default_model_path

    source = default_model_path()
    config = AutoConfig.from_pretrained(source)
    config.num_hidden_layers = 0
    BertModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return folder


def tokenization_seconds(model: Path, texts: list[str], batch_size: int, chunk: int) -> float:
    """CPU seconds of the workers' own tokenizing step over `texts`, in this process."""
    from transformers import AutoTokenizer

    from inference.batching import prepare
    from inference.tokenize import Direct

    tokenizer = AutoTokenizer.from_pretrained(model)
    direct = Direct.build(tokenizer, 256)  # as the workers' models tokenize (inference/base.py)
    prepare(tokenizer, texts[:chunk], 256, batch_size, direct=direct)  # warm
    started = time.process_time()
    for begin in range(0, len(texts), chunk):  # a chunk at a time, as the workers do
        prepare(tokenizer, texts[begin : begin + chunk], 256, batch_size, direct=direct)
    return time.process_time() - started


# --- the fleet -------------------------------------------------------------------------


class Fleet:
    def __init__(self, logdir: Path, env: dict[str, str], port: int, cwd: Path = ROOT) -> None:
        self.logdir, self.env, self.port, self.cwd = logdir, env, port, cwd
        self.procs: dict[str, subprocess.Popen] = {}
        self.share: dict[str, str] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.logdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(
            argv, env={**os.environ, **self.env, **(env or {})}, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, cwd=self.cwd,
        )  # fmt: skip

    def up(self, workers: int, interactive: bool = True) -> dict[str, str]:
        """Web, `workers` cpu workers and (where the run has interactive levels) an
        interactive worker, each answering; returns the worker nodes by name. A fleet
        measured only on batch jobs starts none: its start is a model load of CPU, and idle
        it would only add its heartbeats to the batch figures."""
        from core.config.settings import Settings
        from core.queueing.celery_app import make_celery
        from fleet.processes import thread_share

        # Pinged through the fleet's own broker: one run may start fleets on several.
        settings = Settings.from_env({**os.environ, **self.env})
        app = make_celery(settings)
        # Several cpu workers share the cores as `laneway fleet` shares them.
        share = self.share = thread_share(settings, workers)
        host = socket.gethostname()
        tag = uuid.uuid4().hex[:4]
        nodes = {f"cpu{i}": f"cp-cpu{i}-{tag}" for i in range(workers)}
        if interactive:
            nodes["interactive"] = f"cp-interactive-{tag}"
        self.start("web", [str(BIN / "laneway"), "web", "--port", str(self.port)])
        for name, node in nodes.items():
            lane = "interactive" if name == "interactive" else "cpu"
            argv = [str(BIN / "laneway"), "worker", lane, "--name", node]
            self.start(name, argv, share if lane == "cpu" else None)
        deadline = time.monotonic() + 300
        waiting = dict(nodes)
        while waiting:
            for name, node in list(waiting.items()):
                dead = self.procs[name].poll() is not None
                if dead or time.monotonic() > deadline:
                    raise SystemExit(f"{name} did not start; see {self.logdir / name}.log")
                log = (self.logdir / f"{name}.log").read_bytes()
                pong = app.control.ping(destination=[f"{node}@{host}"], timeout=0.5)
                if pong and b"loaded in pid" in log:
                    del waiting[name]
        app.close()  # a RabbitMQ fleet's vhost is deleted after its run
        while not self.healthy():
            if self.procs["web"].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the web app did not start; see {self.logdir}/web.log")
            time.sleep(0.2)
        return nodes

    def healthy(self) -> bool:
        from bench.latency import web_healthy

        return web_healthy(self.port)

    def pids(self, names: list[str]) -> list[int]:
        return [self.procs[n].pid for n in names]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def call(port: int, method: str, path: str, key: str, body: bytes | None = None) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    conn.request(method, path, body, headers)
    response = conn.getresponse()
    data = response.read()
    if response.status >= 300:
        raise SystemExit(f"{method} {path}: {response.status} {data[:300]!r}")
    return json.loads(data)


def per_thousand(spent: dict[str, float], items: int) -> dict[str, float]:
    return {k: round(1_000_000 * v / items, 2) for k, v in spent.items()}


def run_job(
    fleet: Fleet, meter: Meter, key: str, task: str, texts: list[str], profile: Profile | None
) -> dict:
    """One job through the web app, from the POST to its final status."""
    from sqlalchemy import func, select

    from core.config.settings import get_settings
    from db.models import Chunk, Job, Result
    from db.session import session_scope

    body: dict = {"task": task, "items": [{"id": f"i{i}", "text": t} for i, t in enumerate(texts)]}
    payload = json.dumps(body).encode()
    if profile:
        profile.start(task, meter.tiers)
    before = meter.read()
    started, clock = time.perf_counter(), time.time()
    job = call(fleet.port, "POST", "/v1/jobs", key, payload)
    accepted = time.perf_counter() - started
    # The final status is read from the job's row: a GET /v1/jobs/<id> every 0.1 s would
    # add its progress count over the results to what is measured.
    job_id = uuid.UUID(job["id"])
    while True:
        time.sleep(0.1)
        with session_scope(get_settings()) as session:
            if session.scalar(select(Job.status).where(Job.id == job_id)) in FINAL:
                break
    elapsed = time.perf_counter() - started
    spent = Meter.spent(before, meter.read())
    row = call(fleet.port, "GET", f"/v1/jobs/{job_id}", key)
    profiled = profile.stop(task) if profile else None
    with session_scope(get_settings()) as session:
        query = select(func.count(), func.count(Result.error)).where(Result.job_id == job_id)
        results, errors = session.execute(query).one()
        chunk_size = session.scalar(select(Job.chunk_size).where(Job.id == job_id))
        first, last, busy = session.execute(
            select(
                func.min(Chunk.started_at),
                func.max(Chunk.finished_at),
                func.sum(func.extract("epoch", Chunk.finished_at - Chunk.started_at)),
            ).where(Chunk.job_id == job_id)
        ).one()
        finalized = session.scalar(select(Job.finished_at).where(Job.id == job_id))
    # Where the job's wall time went: its intake (until the POST's answer), the wait for
    # the first chunk, the chunks' run, the job's settling after its last chunk; `chunks`:
    # the chunks' own seconds from claim to finish, all workers together.
    timeline = {
        "accepted": round(accepted, 3),
        "first_chunk_started": round(first.timestamp() - clock, 3) if first else None,
        "last_chunk_finished": round(last.timestamp() - clock, 3) if last else None,
        "finalized": round(finalized.timestamp() - clock, 3) if finalized else None,
        "chunks": round(float(busy or 0.0), 3),
    }
    stages = row.get("stage_seconds") or {}
    spent["worker_outside_model"] = spent["cpu_workers"] - float(stages.get("model") or 0.0)
    return {
        "task": task,
        "items": len(texts),
        "status": row["status"],
        "results": results,
        "result_errors": errors,
        "seconds": round(elapsed, 2),
        "items_per_s": round(len(texts) / elapsed, 1),
        "chunk_size": chunk_size,
        "stage_seconds": stages,
        "timeline": timeline,
        "cpu_ms_per_1000_items": per_thousand(spent, len(texts)),
        **({"profile": profiled} if profiled else {}),
    }


def one_text_body(texts: Texts) -> str:
    """A one-text embed request's body, the next of `texts`: what every load generator here
    sends."""
    return json.dumps({"items": [{"id": "1", "text": texts.next()}]})


def run_level(
    fleet: Fleet, meter: Meter, key: str, clients: int, seconds: float, profile: Profile | None
) -> dict:
    """`clients` threads, each sending one-text embed requests back to back."""
    from bench.latency import Texts, message_texts, parse_timing, percentile, run_all, slowest_share

    texts = Texts(message_texts())
    latencies: list[float] = []
    stages: list[dict[str, float]] = []
    errors: list[str] = []
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    stop = time.perf_counter() + seconds

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", fleet.port, timeout=60)
        mine, mine_stages = [], []
        while time.perf_counter() < stop:
            body = one_text_body(texts).encode()
            began = time.perf_counter()
            conn.request("POST", "/v1/embed", body, headers)
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                with lock:
                    errors.append(f"{response.status} {data[:200]!r}")
                continue
            mine.append(time.perf_counter() - began)
            mine_stages.append(parse_timing(response.getheader("Server-Timing")))
        conn.close()
        with lock:
            latencies.extend(mine)
            stages.extend(mine_stages)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    if profile:
        profile.start(f"interactive{clients}", meter.tiers, ("web", "interactive_worker"))
    before = meter.read()
    wall = run_all(threads)
    spent = Meter.spent(before, meter.read())
    if profile:
        profile.stop(f"interactive{clients}")
    n = max(1, len(latencies))
    return {
        "clients": clients,
        "load": "python",
        "requests": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "requests_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(1000 * percentile(latencies, 0.50), 2) if latencies else None,
        "p99_ms": round(1000 * percentile(latencies, 0.99), 2) if latencies else None,
        "cpu_ms_per_request": {k: round(1000 * v / n, 3) for k, v in spent.items()},
        # Where the tail's time went: the slowest 1 % of requests, each stage's mean (ms;
        # `view` is the web's whole answer, the rest of `total` is outside it).
        "tail_ms": slowest_share(latencies, stages, 0.01),
    }


# wrk's script (Lua): thread k of T sends bodies k, k+T, k+2T... of the bodies' file, one a
# request (distinct texts as the Python clients send them); `done` writes one JSON line.
WRK_SCRIPT = """
local threads = 0
function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end
function init(args)
  bodies = {}
  for line in io.lines(args[1]) do bodies[#bodies + 1] = line end
  step, n = tonumber(args[2]), id
  headers = {["Authorization"] = "Bearer " .. args[3], ["Content-Type"] = "application/json"}
end
function request()
  local body = bodies[(n % #bodies) + 1]
  n = n + step
  return wrk.format("POST", "/v1/embed", headers, body)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "us": %d, "status": %d, "socket": %d, "p50_us": %d, "p99_us": %d}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""
WRK_THREADS = 2  # wrk's event loops: one a core of these two


def wrk_level(port: int, key: str, clients: int, seconds: float) -> tuple[dict, float]:
    """wrk's figures for `clients` keep-alive connections sending one-text embed requests
    to 127.0.0.1:`port` for `seconds` (requests, us, status: non-2xx/3xx answers, socket:
    errors, p50_us, p99_us), and the CPU seconds wrk took."""
    from bench.latency import Texts, message_texts

    texts = Texts(message_texts())
    folder = Path(tempfile.mkdtemp(prefix="cp-wrk-"))
    try:
        bodies = folder / "bodies.jsonl"
        # More bodies than any run sends: a text comes back only past 4,000 requests/s.
        with bodies.open("w") as fh:
            for _ in range(max(1000, int(4000 * seconds))):
                fh.write(one_text_body(texts) + "\n")
        script = folder / "level.lua"
        script.write_text(WRK_SCRIPT)
        threads = max(1, min(WRK_THREADS, clients))
        argv = ["wrk", "-t", str(threads), "-c", str(clients), "-d", f"{seconds:g}s",
                "--timeout", "60s", "-s", str(script), f"http://127.0.0.1:{port}/",
                "--", str(bodies), str(threads), key]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = proc.stdout.read().decode() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines = [line for line in out.splitlines() if line.startswith('{"requests"')]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"wrk failed: {out[-2000:]}")
    return json.loads(lines[-1]), usage.ru_utime + usage.ru_stime


def run_level_wrk(fleet: Fleet, meter: Meter, key: str, clients: int, seconds: float) -> dict:
    """`clients` keep-alive connections of wrk (a C load generator: epoll and LuaJIT), each
    sending one-text embed requests back to back: `run_level`'s requests from a client that
    takes a fraction of the CPU Python's threads take from the cores the fleet runs on."""
    before = meter.read()
    got, wrk_cpu = wrk_level(fleet.port, key, clients, seconds)
    spent = Meter.spent(before, meter.read())
    spent["client"] = spent.get("client", 0.0) + wrk_cpu
    answered = got["requests"] - got["status"]
    n = max(1, answered)
    return {
        "clients": clients,
        "load": "wrk",
        "requests": answered,
        "errors": got["status"] + got["socket"],
        "requests_per_s": round(answered / (got["us"] / 1e6), 1),
        "p50_ms": round(got["p50_us"] / 1000, 2),
        "p99_ms": round(got["p99_us"] / 1000, 2),
        "cpu_ms_per_request": {k: round(1000 * v / n, 3) for k, v in spent.items()},
    }


# How the summary names each tier: a broker's process serves anything else using it too.
TIER_LABELS = {
    "cpu_workers": "cpu workers",
    "worker_outside_model": "cpu workers outside the model",
    "interactive_worker": "interactive worker",
    "redis": "redis (shared)",
    "rabbitmq": "rabbitmq beam.smp (shared node)",
}


def broker_run(
    name: str, url: str, args: argparse.Namespace, model: Path, texts: list[str],
    tokenization_ms: float, levels: list[int], loads: list[str], logdir: Path,
) -> tuple[dict, dict]:  # fmt: skip
    """Start a fleet whose batch lanes run on `url` (`name`'s broker), on a database and a
    Redis db index of its own, and run the batch jobs and then `levels` of interactive
    clients on it: the broker's section of the report, and the interactive levels."""
    from bench.latency import local_redis_pid
    from core.config.settings import get_settings
    from db.accounts import create_account
    from db.migrate import upgrade
    from db.session import session_scope

    tasks = [t for t in args.tasks.split(",") if t]
    logdir.mkdir()
    saved = dict(os.environ)
    with ExitStack() as cleanup:  # undone in reverse: the fleet first, the environment last
        cleanup.callback(restore_environ, saved)
        database, database_url = create_database(ADMIN_PG)
        cleanup.callback(drop_database, ADMIN_PG, database)
        index = claim_redis_index()
        cleanup.callback(release_redis_index, index)
        redis_url = f"{REDIS_HOST}/{index}"
        profile = None
        if args.profile:
            # With --brokers, a folder per broker.
            folder = Path(args.profile) / name if args.brokers else Path(args.profile)
            profile = Profile(folder, ADMIN_PG, database)
            profile.log_statements()
        # Every process of the fleet, this one included, reads these (modules read them at
        # import; this one's settings are read again for each fleet).
        settings_env = {
            "LANEWAY_DATABASE_URL": database_url,
            "LANEWAY_REDIS_URL": redis_url,
            "LANEWAY_BROKER_URL": url,
            "LANEWAY_HOME": str(logdir / "home"),
            "LANEWAY_MODEL_PATH": str(model),
            # One account sends every request: its plan's rate and size limits are lifted.
            "LANEWAY_RATE_LIMIT_TRIAL": "100000000/minute",
            "LANEWAY_MAX_ITEMS_TRIAL": str(max(args.items, 1000)),
            "LANEWAY_MAX_UPLOAD_BYTES_TRIAL": str(64 << 20),
        }
        os.environ.update(settings_env)
        get_settings.cache_clear()
        fleet = Fleet(logdir, settings_env, args.port)
        cleanup.callback(fleet.stop)
        upgrade(get_settings())
        with session_scope(get_settings()) as session:
            _, key = create_account(session, f"cp-{uuid.uuid4().hex[:6]}", "trial")
        nodes = fleet.up(args.workers, interactive=bool(levels))
        tiers = {
            "web": fleet.pids(["web"]),
            "cpu_workers": fleet.pids([n for n in nodes if n.startswith("cpu")]),
        }
        if "interactive" in nodes:
            tiers["interactive_worker"] = fleet.pids(["interactive"])
        # Redis serves a RabbitMQ fleet too: results, fair share, the interactive path.
        found = {"redis": local_redis_pid(redis_url)}
        if name == "rabbitmq":
            found["rabbitmq"] = rabbitmq_pid(url)
        tiers.update({tier: [pid] for tier, pid in found.items() if pid})
        meter = Meter(tiers, ADMIN_PG, database)
        run: dict = {
            "load_average_start": [round(x, 2) for x in os.getloadavg()],
            # What the cpu workers ran with beside the defaults: their share of the cores.
            "cpu_worker_env": fleet.share,
            "batch": {},
        }
        for task in tasks:
            if args.warmup:
                run_job(fleet, meter, key, task, texts[: args.warmup], None)
            done = run_job(fleet, meter, key, task, texts, profile)
            done["cpu_ms_per_1000_items"]["tokenization"] = tokenization_ms
            run["batch"][task] = done
            print(json.dumps({"broker": name, **done}), flush=True)
        interactive = {}
        for load in loads:
            for clients in levels:
                if load == "wrk":
                    level = run_level_wrk(fleet, meter, key, clients, args.seconds)
                else:
                    level = run_level(fleet, meter, key, clients, args.seconds, profile)
                interactive[f"wrk.{clients}" if load == "wrk" else str(clients)] = level
                print(json.dumps(level), flush=True)
        return run, interactive


def restore_environ(saved: dict[str, str]) -> None:
    from core.config.settings import get_settings

    os.environ.clear()
    os.environ.update(saved)
    get_settings.cache_clear()


def summary(report: dict) -> str:
    """Each broker's batch figures, one broker after the other."""
    lines = []
    for name, run in report["brokers"].items():
        lines.append(f"{name}, batch lanes on {name} (a fleet of its own):")
        for task, job in run["batch"].items():
            lines.append(
                f"  {task}: {job['items']:,} items {job['status']}, {job['results']:,} results"
                f" ({job['result_errors']} errors), {job['items_per_s']:,} items/s"
                f" in chunks of {job.get('chunk_size')}"
            )
            cpu = ", ".join(
                f"{TIER_LABELS.get(tier, tier)} {ms:,}"
                for tier, ms in job["cpu_ms_per_1000_items"].items()
            )
            lines.append(f"    CPU ms per 1,000 items: {cpu}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    from core.config.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000, help="items per batch job")
    parser.add_argument("--tasks", default="embed,classify", help="batch jobs to run ('' none)")
    parser.add_argument("--clients", default="1,8,64", help="interactive levels ('' none)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per interactive level")
    parser.add_argument(
        "--load", default="python", metavar="LIST",
        help="the interactive levels' load generators, one after the other: python (threads "
        "of this process, the default), wrk (a C load generator, as `interactive.wrk.<clients>`)",
    )  # fmt: skip
    parser.add_argument(
        "--warmup", type=int, default=2000, metavar="N",
        help="items of the unmeasured job of each task before its measured one (0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=int, default=None,
        help="`laneway worker cpu` processes (n of them take cores/n torch threads each, as "
        "`laneway fleet` gives them); default: as many as `laneway fleet` starts here",
    )  # fmt: skip
    parser.add_argument(
        "--brokers", default=None, metavar="LIST",
        help="batch brokers to measure one after the other, each with a fleet of its own "
        "(redis,rabbitmq: RabbitMQ on a fresh vhost); default: LANEWAY_BROKER_URL's as it is",
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--json", default=None, metavar="PATH", help="write the figures here")
    parser.add_argument(
        "--profile", default=None, metavar="DIR",
        help="py-spy each tier and log Postgres' statements during the batch jobs and the "
        "interactive levels (web and interactive worker), into DIR",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the logs' folder")
    args = parser.parse_args(argv)
    if args.workers is None:
        from fleet.processes import cpu_worker_count

        args.workers = cpu_worker_count(Settings.from_env())
    if args.items < 1 or args.workers < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error(
            "--items and --workers take at least 1, --seconds more than 0, --warmup 0 or more"
        )
    tasks = [t for t in args.tasks.split(",") if t]
    levels = [int(c) for c in args.clients.split(",") if c]
    loads = args.load.split(",")
    if not loads or set(loads) - {"python", "wrk"} or len(set(loads)) < len(loads):
        parser.error(f"--load takes each of python, wrk once, not {args.load!r}")
    if "wrk" in loads and levels and shutil.which("wrk") is None:
        parser.error("--load wrk needs wrk on PATH (Debian's wrk package; `make wrk`)")
    settings = Settings.from_env()
    if args.brokers is None:
        brokers = ["rabbitmq" if settings.broker_is_rabbitmq else "redis"]
    else:
        brokers = [b for b in args.brokers.split(",") if b]
        if not brokers or set(brokers) - set(BROKERS) or len(set(brokers)) < len(brokers):
            parser.error(f"--brokers takes each of {', '.join(BROKERS)} once, not {args.brokers!r}")

    from bench.latency import finish, speed_probe

    logdir = Path(tempfile.mkdtemp(prefix="laneway-controlplane-"))
    report: dict = {
        "format": 2,  # the keys below are read by other tools: add keys, never rename one
        "model": "BertModel, MiniLM's config and tokenizer, num_hidden_layers=0",
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "speed_probe_start_s": speed_probe(),  # and at the end: bench/latency.py finish
        # Each batch broker's run, in the order run: `brokers.<broker>.batch.<task>`.
        "brokers": {},
        # The interactive path runs on Redis whatever the batch broker: measured once, on
        # the first broker's fleet.
        "interactive_fleet": brokers[0],
        "interactive": {},
    }
    try:
        from bench.throughput import load_texts

        model = build_free_model(logdir / "model")
        texts = load_texts(args.items)
        # The same texts through the workers' tokenizing step alone, in this process.
        tokenizing = (
            tokenization_seconds(model, texts, settings.batch_size, settings.chunk_size)
            if tasks
            else 0.0
        )
        tokenization_ms = round(1_000_000 * tokenizing / len(texts), 2)
        for i, name in enumerate(brokers):
            given = nullcontext(settings.broker_url)  # the environment's broker, as it is
            with batch_broker(name) if args.brokers else given as url:
                run, interactive = broker_run(
                    name, url, args, model, texts, tokenization_ms, levels if i == 0 else [],
                    loads, logdir / name,
                )  # fmt: skip
            report["brokers"][name] = run
            report["interactive"].update(interactive)
    finally:
        if not args.keep:
            shutil.rmtree(logdir, ignore_errors=True)
    finish(report, args.json)
    print(summary(report), flush=True)
    return report


if __name__ == "__main__":
    main()
