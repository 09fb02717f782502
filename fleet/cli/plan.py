"""`laneway calibrate` and `laneway plan`: measure this machine's costs per item and per
request into a profile, and size a fleet for a target load from it (fleet/capacity.py)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import click

from fleet.capacity import PlanError
from fleet.cli.common import cli_settings


def _profile_path(given: Path | None) -> Path:
    from fleet.calibration import default_path

    return given or default_path(cli_settings().home)


def profile_option(what: str) -> Callable:
    return click.option("--profile", "path", type=click.Path(path_type=Path), default=None,
                        help=f"{what} (default LANEWAY_HOME/capacity-profile.json)")  # fmt: skip


def _batch_target(values: tuple[str, ...]) -> dict[tuple[str, str], float]:
    """--batch LANE:TASK=ITEMS_PER_HOUR, repeated: loads named for the same lane and task
    add up (two uploads' nightly loads on one lane are one load of both), none is dropped."""
    out: dict[tuple[str, str], float] = {}
    for value in values:
        where, sep, amount = value.partition("=")
        lane, colon, task = where.partition(":")
        if not (sep and colon):
            raise PlanError(f"--batch takes LANE:TASK=ITEMS_PER_HOUR, not {value!r}")
        try:
            items = float(amount.replace("_", ""))
        except ValueError:
            raise PlanError(f"--batch {value!r}: {amount!r} is not a number") from None
        key = (lane.strip(), task.strip())
        if not (items > 0 and math.isfinite(items)):
            raise PlanError(f"{key[0]}:{key[1]} needs a positive number of items per hour")
        out[key] = out.get(key, 0.0) + items
    return out


MAX_CLIENTS = 1024  # the benchmark's clients are threads of one process on this machine
EMBEDDED_REFUSED = (
    "laneway calibrate measures the Postgres and Redis a fleet runs on: set "
    "LANEWAY_DATABASE_URL (postgresql://...) and LANEWAY_REDIS_URL (redis://...). The "
    "embedded default (SQLite and a Redis under LANEWAY_HOME) is for trying Laneway; "
    "a fleet sized from it would be sized for neither"
)


def _levels(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """--levels: client counts, comma-separated, each from 1 to MAX_CLIENTS; checked
    before any benchmark runs (the interactive one runs last, minutes in), and given to
    it in rising order, once each."""
    try:
        counts = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: give whole numbers of clients, comma-separated (1,8,64)"
        ) from None
    if not counts:
        raise click.BadParameter("give at least one number of clients (1,8,64)")
    if counts[0] < 1 or counts[-1] > MAX_CLIENTS:
        raise click.BadParameter(f"{value!r}: each count of clients is from 1 to {MAX_CLIENTS}")
    return ",".join(map(str, counts))


def _check_writable(target: Path) -> None:
    """Refuse a profile path that could not be written: a folder, or a folder that cannot
    be made or written to."""
    if target.is_dir():
        raise click.ClickException(f"--profile {target} is a folder: name a file")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(f"cannot make {target.parent}: {exc.strerror}") from None
    if not os.access(target.parent, os.W_OK) or (
        target.exists() and not os.access(target, os.W_OK)
    ):
        raise click.ClickException(f"cannot write the profile to {target}: permission denied")


@click.command()
@profile_option("where to write it")
@click.option("--task", default="classify", type=click.Choice(["classify", "embed", "score"]))
@click.option(
    "--items", default=20000, type=click.IntRange(min=100), help="the batch benchmark's job"
)
@click.option(
    "--seconds", default=10.0, type=click.FloatRange(min=1), help="each interactive level's length"
)
@click.option(
    "--levels", default="1,8,64", callback=_levels, help="interactive clients, comma-separated"
)
def calibrate(path: Path | None, task: str, items: int, seconds: float, levels: str) -> None:
    """Measure this machine: run the batch and interactive benchmarks (bench/) and store
    each tier's CPU per item and per request as the profile `laneway plan` reads. Run it
    on an otherwise idle machine against the Postgres and Redis the fleet uses."""
    from db.migrate import upgrade
    from fleet.calibration import calibrate as run
    from fleet.calibration import stop_on_sigterm, write_profile

    settings = cli_settings()
    if settings.embedded_redis or not settings.database_url.startswith("postgresql"):
        raise click.ClickException(EMBEDDED_REFUSED)
    target = _profile_path(path)
    _check_writable(target)  # before minutes of benchmarks, not after
    upgrade(settings)  # the benchmarks' jobs and the footprint read the tables
    restore = stop_on_sigterm()
    try:
        profile = run(task, items, seconds, levels, settings.database_url, settings.redis_url,
                      getattr(settings, f"{task}_model"), say=click.echo)  # fmt: skip
    except PlanError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        restore()
    write_profile(profile, target)
    click.echo(f"profile written to {target}")


@click.command()
@profile_option("the profile")
@click.option(
    "--batch",
    "batch",
    multiple=True,
    metavar="LANE:TASK=ITEMS_PER_HOUR",
    help="a batch load, e.g. cpu:classify=500000 (repeatable)",
)
@click.option(
    "--interactive", "rps", type=float, default=0.0, help="interactive requests per second"
)
@click.option("--interactive-task", default="classify")
@click.option("--p99-ms", type=float, default=500.0, help="the interactive p99 to meet")
@click.option("--model", default="", help="the model the load runs (default the profile's)")
@click.option("--device", default="cpu", help="cpu or cuda: where the model runs")
@click.option(
    "--device-rate",
    type=float,
    default=None,
    help="one GPU's model items/s, where the profile has none (e.g. a published figure)",
)
@click.option("--device-source", default="", help="where --device-rate comes from")
@click.option(
    "--check-against",
    "against",
    type=click.Path(path_type=Path),
    default=None,
    help="instead of a plan: the profile's predictions for its own machine beside "
    "what this later profile measured there (exit 1 past 20 %)",
)
@click.option("--json", "as_json", is_flag=True, help="the plan as one JSON object")
def plan(path: Path | None, batch: tuple[str, ...], rps: float, interactive_task: str,
         p99_ms: float, model: str, device: str, device_rate: float | None,
         device_source: str, against: Path | None, as_json: bool) -> None:  # fmt: skip
    """How many of each process, which devices, and what Postgres and Redis need for a
    target load, with its cost per hour and per item, from this machine's profile."""
    if against is not None:
        _check(path, against, as_json)
        return
    from db.session import MAX_OVERFLOW, POOL_SIZE
    from fleet.calibration import read_profile
    from fleet.capacity import Pools, Prices, Target, profile_from_dict
    from fleet.capacity import plan as make_plan

    settings = cli_settings()
    try:
        profile = profile_from_dict(read_profile(_profile_path(path)))
        target = Target(
            batch=_batch_target(batch), interactive_rps=rps, interactive_task=interactive_task,
            p99_ms=p99_ms, model=model, device=device.lower(), device_rate=device_rate,
            device_source=device_source,
        )  # fmt: skip
        pools = Pools(POOL_SIZE, MAX_OVERFLOW, settings.web_threads, settings.interactive_threads,
                      settings.batch_max, settings.batch_wait_ms)  # fmt: skip
        result = make_plan(target, profile, Prices(settings.cpu_price, settings.gpu_price), pools)
    except PlanError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result))
        return
    for line in render(result):
        click.echo(line)


def _check(path: Path | None, against: Path, as_json: bool) -> None:
    from fleet.calibration import read_profile
    from fleet.capacity import profile_from_dict
    from fleet.capacity_check import checks

    try:
        profile = profile_from_dict(read_profile(_profile_path(path)))
        later = read_profile(against)  # only what it measured is read
        rows = checks(profile, later.get("measured") or {})
    except PlanError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(rows))
    else:
        for r in rows:
            mark = "ok" if r["within"] else "OFF"
            click.echo(f"{r['check']:48} predicted {r['predicted']:>8} measured "
                       f"{r['measured']:>8} ({r['error']:+.0%}) {mark}")  # fmt: skip
    if not all(r["within"] for r in rows):
        raise SystemExit(1)


def render(result: dict) -> list[str]:
    """The plan as a readable table."""
    m = result["profile"]["machine"]
    lines = [f"from a profile of {result['profile']['model']} on {m['cpu']}, {m['cores']} cores "
             f"(measured {m.get('measured_at', '?')}); each tier at most "
             f"{result['headroom']:.0%} busy"]  # fmt: skip
    if result["device"] == "cuda":
        lines.append(f"GPU: {result['device_rate']:g} model items/s each "
                     f"({result['device_source'] or 'given'})")  # fmt: skip
    lines += ["", f"{'process':20} {'count':>6} {'cores each':>10} {'GPUs':>5} {'busy cores':>10}"]
    for row in result["processes"]:
        lines.append(f"{row['process']:20} {row['count']:>6} {row['cores_each']:>10} "
                     f"{row['gpus']:>5} {row['busy_cores']:>10}")  # fmt: skip
    pg, rd = result["postgres"], result["redis"]
    lines += [
        "",
        f"Postgres: {pg['cores']} cores ({pg['busy_cores']} busy), connections "
        f"{pg['connections_steady']} steady / {pg['connections_max']} at most, "
        f"{pg['memory_gib']} GiB memory, {pg['rows_per_s']} rows/s, "
        f"{pg['write_mb_per_s']} MB/s ({pg['disk_gb_per_day']} GB a day)",
        f"Redis: {rd['cores']} cores ({rd['busy_cores']} busy), up to "
        f"{rd['connections_max']} connections, {rd['memory_gib']} GiB memory",
    ]
    inter = result["interactive"]
    if inter:
        if inter["feasible"]:
            lines.append(f"interactive {inter['task']}: {inter['requests_per_s']:g} requests/s, "
                         f"p99 {inter['p99_ms']} ms predicted (asked {inter['p99_target_ms']:g}; "
                         f"alone {inter['p99_alone_ms']} ms), batches of {inter['batch']}, "
                         f"{inter['utilization']:.0%} busy")  # fmt: skip
        else:
            lines.append(f"interactive {inter['task']}: {inter['reason']}")
    cost = result["cost"]
    lines += ["", f"cost: ${cost['per_hour']:.2f} an hour (CPU ${cost['cpu_price']}/core-s, "
                  f"GPU ${cost['gpu_price']}/device-s)"]  # fmt: skip
    if cost["per_item"] is not None:
        lines.append(f"  batch ${cost['batch_per_hour']:.2f} an hour, "
                     f"${cost['per_item']:.8f} an item")  # fmt: skip
    if cost["per_request"] is not None:
        lines.append(f"  interactive ${cost['interactive_per_hour']:.2f} an hour, "
                     f"${cost['per_request']:.8f} a request")  # fmt: skip
    return lines
