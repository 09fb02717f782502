"""Re-derive the hardware-dependent defaults on this machine, and print the settings to set.

Each stage times two ways of running the model in this process, interleaved batch by batch so
that the machine's drift falls on both alike, and derives the choice that is faster here:

- precision: fp32 against what LANEWAY_PRECISION=auto picks on this CPU (bf16 where it is
  native, else fp16 weights), on every core, with the start-up accuracy check's tolerance;
  derives LANEWAY_PRECISION.
- half-rows: fp16-weight products against fp32 by row count (a BERT layer's six products),
  on every core; derives HALF_ROWS (inference/halfweights.py), the rows up to which fp16
  weights run.
- packed: the packed forward (inference/packed.py) against transformers' own on a model
  thread of one torch thread; it has no setting, a loss here is a regression to report.
- lone: ONNX Runtime against torch for one text alone on every core; derives
  LANEWAY_LONE_RUNTIME.
- model-threads: one batch at a time on every core against a batch per core side by side;
  derives LANEWAY_INTERACTIVE_MODEL_THREADS.
- tokenizer-threads: the tokenizer's thread pool on and off with model threads side by
  side; derives TOKENIZERS_PARALLELISM for interactive workers (workers/signals.py).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/calibrate.py [STAGE ...] [--quick] [--json]

Run it on an otherwise idle machine: the figures of a loaded one say little. The shipped
defaults were derived on the machine docs/benchmarks.md names.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from workers.cores import openmp_env  # noqa: E402

os.environ.update(openmp_env())  # as the workers run: libgomp reads it when torch loads
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CORES = os.cpu_count() or 1
STAGES = ("precision", "half-rows", "packed", "lone", "model-threads", "tokenizer-threads")


def messages() -> list[str]:
    """The sample customer messages, made distinct (no cache or tokenizer memo helps)."""
    with open(ROOT / "examples" / "customer_messages.csv", newline="") as fh:
        rows = [row["text"] for row in csv.DictReader(fh)]
    return [f"{t} #{i}" for i, t in enumerate((rows * 4)[:4000])]


def batches(sample: list[str], size: int, rounds: int, offset: int = 0) -> Iterator[list[str]]:
    for n in range(rounds):
        start = (offset + n * 97 * size) % (len(sample) - size)
        yield sample[start : start + size]


def on_thread(fn: Callable[[], Any], torch_threads: int) -> Any:
    """`fn` on a fresh thread of `torch_threads` torch threads, as a worker's model thread."""
    out: list = []

    def run() -> None:
        torch.set_num_threads(torch_threads)
        out.append(fn())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0]


def race(
    contenders: dict[str, Callable[[list[str]], Any]],
    sample: list[str],
    size: int,
    rounds: int,
    torch_threads: int,
) -> dict[str, float]:
    """The median ms per batch of `size` texts of each contender, which alternate batch by
    batch (and which goes first, round by round), on a thread of `torch_threads`."""

    def run() -> dict[str, float]:
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for fn in contenders.values():
            fn(sample[:size])  # each one's first call (threads, shapes) stays out of the times
        for n, batch in enumerate(batches(sample, size, rounds)):
            order = list(contenders) if n % 2 == 0 else list(reversed(contenders))
            for k in order:
                began = time.perf_counter()
                contenders[k](batch)
                times[k].append((time.perf_counter() - began) * 1000)
        return {k: statistics.median(v) for k, v in times.items()}

    return on_thread(run, torch_threads)


def side_by_side(
    encoder: Any, sample: list[str], size: int, threads: int, rounds: int, torch_threads: int = 1
) -> float:
    """Texts per second of `threads` model threads of `torch_threads` each, side by side.
    Each thread warms up first (its OpenMP team, its first shapes), as a worker's model
    threads have long before a request comes; the clock starts once all have."""
    ready = threading.Barrier(threads + 1)

    def work(k: int) -> None:
        torch.set_num_threads(torch_threads)
        encoder.encode(sample[:size])
        ready.wait()
        for batch in batches(sample, size, rounds, offset=k * 1000):
            encoder.encode(batch)

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    ready.wait()
    began = time.perf_counter()
    for w in workers:
        w.join()
    return threads * rounds * size / (time.perf_counter() - began)


# --- what each stage derives from its figures (pure: tests/unit/test_calibrate.py) --------


def derive_precision(speedup: float, within_tolerance: bool) -> str:
    """auto where its reduced precision is faster than fp32 and passes the check, else fp32."""
    return "auto" if speedup > 1.0 and within_tolerance else "fp32"


def derive_half_rows(speedups: dict[int, float]) -> int:
    """The largest row count up to which fp16 weights win at every count measured (0: they
    lose already at the smallest): past the first loss a product is bound by arithmetic,
    and a later win is noise or a kernel's quirk that one more count would not confirm."""
    rows = 0
    for count in sorted(speedups):
        if speedups[count] <= 1.0:
            break
        rows = count
    return rows


def derive_model_threads(alone: list[float], side: list[float], cores: int) -> int:
    """A model thread per core where batches side by side served more texts a second than
    one batch on every core for most batch sizes measured, else one."""
    wins = sum(s > a for a, s in zip(alone, side, strict=True))
    return cores if 2 * wins > len(alone) else 1


def derive_tokenizer_pool(on: list[float], off: list[float]) -> bool:
    """Whether interactive workers keep the tokenizer's thread pool: only where it served
    more texts a second than one tokenizer thread each for most batch sizes measured."""
    wins = sum(x > y for x, y in zip(on, off, strict=True))
    return 2 * wins > len(on)


# --- the stages: each returns its table rows and the settings it derives ------------------


def stage_precision(sample: list[str], rounds: int) -> tuple[list[str], dict[str, str]]:
    from inference.accuracy import TOLERANCE
    from inference.encoder import Encoder
    from inference.precision import choose

    auto = choose("auto", "cpu").precision
    if auto == "fp32":
        return ["auto is fp32 on this CPU: nothing to compare"], {"LANEWAY_PRECISION": "auto"}
    fp32, reduced = Encoder(precision="fp32"), Encoder(precision=auto)
    cosine = F.cosine_similarity(fp32.encode(sample[:256]), reduced.encode(sample[:256])).min()
    ms = race({"fp32": fp32.encode, auto: reduced.encode}, sample, 32, rounds, CORES)
    ratio = ms["fp32"] / ms[auto]
    within = float(cosine) >= TOLERANCE.cosine
    rows = [
        f"batch 32 on {CORES} threads: fp32 {ms['fp32']:.1f} ms, {auto} {ms[auto]:.1f} ms "
        f"({ratio:.2f}x); cosine to fp32 min {float(cosine):.6f} "
        f"({'within' if within else 'OUTSIDE'} the start-up check's {TOLERANCE.cosine})"
    ]
    return rows, {"LANEWAY_PRECISION": derive_precision(ratio, within)}


def stage_half_rows(sample: list[str], rounds: int) -> tuple[list[str], dict[str, str]]:
    from inference import halfweights

    if not halfweights.available():
        return ["no fp16-weight products on this CPU (FBGEMM needs x86 with AVX2)"], {}
    hidden, inner = 384, 1536  # MiniLM-L6's widths: q, k, v, o, then up and down
    shapes = [(hidden, hidden)] * 4 + [(inner, hidden), (hidden, inner)]
    layers = [(torch.randn(o, i) / i**0.5, torch.zeros(o)) for o, i in shapes]
    packed = [halfweights.pack(w, b) for w, b in layers]
    rows, speedups = [], {}
    for n in (16, 64, 128, 256, 512, 768, 1024, 2048):
        xs = {i: torch.randn(n, i) for i in (hidden, inner)}

        def fp32(_: list[str], xs: dict = xs) -> None:
            for w, b in layers:
                F.linear(xs[w.shape[1]], w, b)

        def fp16(_: list[str], xs: dict = xs) -> None:
            for (w, _b), p in zip(layers, packed, strict=True):
                torch.ops.quantized.linear_dynamic_fp16(xs[w.shape[1]], p)

        ms = race({"fp32": fp32, "fp16": fp16}, sample, 1, rounds, CORES)
        ratio = ms["fp32"] / ms["fp16"]
        rows.append(f"{n:5d} rows: fp32 {ms['fp32']:.3f} ms, fp16 weights {ms['fp16']:.3f} ms "
                    f"({ratio:.2f}x)")  # fmt: skip
        speedups[n] = ratio
    return rows, {"HALF_ROWS": str(derive_half_rows(speedups))}


def stage_packed(sample: list[str], rounds: int) -> tuple[list[str], dict[str, str]]:
    from inference.encoder import Encoder
    from inference.precision import choose

    precision = choose("auto", "cpu").precision
    eager, packed = Encoder(precision=precision, packed=False), Encoder(precision=precision)
    if packed.packed is None:
        return ["the packed forward does not apply here (see the log)"], {}
    rows, wins = [], 0
    for size in (1, 4, 8, 32):
        forwards = {"transformers": eager.encode, "packed": packed.encode}
        ms = race(forwards, sample, size, rounds, 1)
        ratio = ms["transformers"] / ms["packed"]
        wins += ratio > 1.0
        rows.append(f"batch {size:2d}, {precision}, one torch thread: transformers "
                    f"{ms['transformers']:.2f} ms, packed {ms['packed']:.2f} ms "
                    f"({ratio:.2f}x)")  # fmt: skip
    verdict = "faster: it stays on" if 2 * wins > 4 else "SLOWER here: a regression to report"
    return [*rows, f"the packed forward (no setting): {verdict}"], {}


def stage_lone(sample: list[str], rounds: int) -> tuple[list[str], dict[str, str]]:
    from inference.encoder import Encoder
    from inference.precision import choose

    encoder = Encoder(precision=choose("auto", "cpu").precision)
    said = encoder.run_lone_texts("auto", CORES)
    lone = encoder.lone
    if lone is None:  # auto already keeps torch here (the reason is in `said`)
        return [f"one text alone runs on {said}"], {"LANEWAY_LONE_RUNTIME": "auto"}

    def torch_forward(texts: list[str]) -> Any:
        encoder.lone = None
        try:
            return encoder.encode(texts)
        finally:
            encoder.lone = lone

    ms = race({"torch": torch_forward, "onnxruntime": encoder.encode}, sample, 1, rounds, CORES)
    ratio = ms["torch"] / ms["onnxruntime"]
    rows = [f"one text on {CORES} threads: torch {ms['torch']:.2f} ms, onnxruntime "
            f"{ms['onnxruntime']:.2f} ms ({ratio:.2f}x)"]  # fmt: skip
    return rows, {"LANEWAY_LONE_RUNTIME": "auto" if ratio > 1.0 else "torch"}


def stage_model_threads(sample: list[str], rounds: int) -> tuple[list[str], dict[str, str]]:
    from inference.encoder import Encoder
    from inference.precision import choose

    encoder = Encoder(precision=choose("auto", "cpu").precision)
    rows, alone, side = [], [], []
    for size in (1, 4, 8):
        # Both timed alike: the wall clock over `rounds` batches a model thread.
        alone.append(side_by_side(encoder, sample, size, 1, rounds, torch_threads=CORES))
        side.append(side_by_side(encoder, sample, size, CORES, rounds))
        rows.append(f"batch {size}: one at a time on {CORES} threads {alone[-1]:.0f} texts/s, "
                    f"{CORES} side by side on a thread each {side[-1]:.0f} texts/s")  # fmt: skip
    threads = derive_model_threads(alone, side, CORES)
    return rows, {"LANEWAY_INTERACTIVE_MODEL_THREADS": str(threads)}


def stage_tokenizer_threads(sample: list[str], rounds: int) -> tuple[list[str], dict[str, str]]:
    from inference.encoder import Encoder
    from inference.precision import choose

    encoder = Encoder(precision=choose("auto", "cpu").precision)
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    rows, pool_on, pool_off = [], [], []
    try:
        for size in (1, 3, 8):
            rates: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(2):  # alternated: the library reads the variable at every call
                for pool in (True, False):
                    os.environ["TOKENIZERS_PARALLELISM"] = "true" if pool else "false"
                    rates[pool].append(side_by_side(encoder, sample, size, CORES, rounds))
            on, off = statistics.median(rates[True]), statistics.median(rates[False])
            pool_on.append(on)
            pool_off.append(off)
            rows.append(f"batch {size}, {CORES} model threads: pool on {on:.0f} texts/s, "
                        f"off {off:.0f} ({off / on:.2f}x)")  # fmt: skip
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
    keep = derive_tokenizer_pool(pool_on, pool_off)
    rows.append("TOKENIZERS_PARALLELISM applies to interactive workers (workers/signals.py)")
    return rows, {"TOKENIZERS_PARALLELISM": "true" if keep else "false"}


def shipped() -> dict[str, str]:
    """The defaults each stage re-derives, as this checkout ships them."""
    from core.config.settings import Settings
    from inference import halfweights

    fields = Settings.model_fields
    return {
        "LANEWAY_PRECISION": fields["precision"].default,
        "HALF_ROWS": str(halfweights.HALF_ROWS),
        "LANEWAY_LONE_RUNTIME": fields["lone_runtime"].default,
        "LANEWAY_INTERACTIVE_MODEL_THREADS": str(CORES),  # None: one per core
        "TOKENIZERS_PARALLELISM": "false",  # workers/signals.py, interactive workers
    }


def advice(derived: dict[str, str], defaults: dict[str, str]) -> list[str]:
    """One line per derived value: kept as shipped, or the setting to set."""
    lines = []
    for name, value in derived.items():
        where = " in inference/halfweights.py" if name == "HALF_ROWS" else ""
        if value == defaults.get(name):
            lines.append(f"{name}={value}  (the default: nothing to set)")
        else:
            lines.append(f"{name}={value}  (default {defaults.get(name)}: set it{where})")
    return lines


RUN = {
    "precision": stage_precision,
    "half-rows": stage_half_rows,
    "packed": stage_packed,
    "lone": stage_lone,
    "model-threads": stage_model_threads,
    "tokenizer-threads": stage_tokenizer_threads,
}


def rounds_arg(text: str) -> int:
    """--rounds: a whole number of batches, at least one (a median needs a figure)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, not {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stages", nargs="*", help=f"of {', '.join(STAGES)} (default: every one)")
    parser.add_argument("--quick", action="store_true", help="few rounds: proves it runs")
    parser.add_argument("--rounds", type=rounds_arg, default=None, help="batches per contender")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    unknown = [s for s in args.stages if s not in STAGES]
    if unknown:
        parser.error(f"unknown stage {', '.join(unknown)}: expected some of {', '.join(STAGES)}")
    rounds = args.rounds or (6 if args.quick else 60)
    sample = messages()
    report: dict[str, Any] = {"cores": CORES, "torch": torch.__version__, "rounds": rounds}
    derived: dict[str, str] = {}
    for stage in args.stages or STAGES:
        rows, found = RUN[stage](sample, rounds)
        report[stage] = rows
        derived.update(found)
        if not args.json:
            print(f"== {stage}", *rows, sep="\n  ", flush=True)
    report["derived"] = derived
    report["advice"] = advice(derived, shipped())
    if args.json:
        print(json.dumps(report))
        return
    print(f"\nderived on {CORES} cores, {rounds} rounds a contender:")
    for line in report["advice"]:
        print(f"  {line}")


if __name__ == "__main__":
    main()
