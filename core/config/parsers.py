"""Parsers and validators of single LANEWAY_* variables, used by the Settings fields
(core/config/settings.py): each turns the raw text into its value or raises a
SettingsError that names the variable."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, Strict, ValidationError
from pydantic_settings import NoDecode

from core.vocab import FAULTS, MODEL_KINDS

MIN_SECRET_KEY_CHARS = 32


class SettingsError(ValueError):
    """A setting is malformed; the message names the variable."""


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: what a model is, where its files are, how long its inputs may be."""

    name: str
    kind: str
    path: str = ""  # "" only for the packaged all-MiniLM-L6-v2
    max_length: int = 256
    labels: tuple[str, ...] | None = None


def models(name: str) -> Callable[[str], dict[str, ModelSpec]]:
    def parse(raw: str) -> dict[str, ModelSpec]:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{name} must be a JSON object: {exc.msg}") from None
        except RecursionError:  # nested deeper than the parser's stack
            raise SettingsError(f"{name} is nested too deeply to be a model list") from None
        if not isinstance(data, dict):
            raise SettingsError(f"{name} must be a JSON object of model name -> entry")
        models = {}
        for model, entry in data.items():
            where = f"{name}[{model!r}]"
            if not isinstance(entry, dict):
                raise SettingsError(f"{where} must be an object with kind and path")
            unknown = set(entry) - {"kind", "path", "max_length", "labels"}
            if unknown:
                raise SettingsError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
            kind = entry.get("kind")
            if kind not in MODEL_KINDS:
                raise SettingsError(f"{where}.kind must be one of {', '.join(MODEL_KINDS)}")
            path = entry.get("path", "")
            if not isinstance(path, str) or not path or not Path(path).is_dir():
                raise SettingsError(f"{where}.path must be an existing model directory: {path!r}")
            max_length = entry.get("max_length", 256)
            if not isinstance(max_length, int) or max_length < 8:
                raise SettingsError(f"{where}.max_length must be an integer of at least 8")
            labels = entry.get("labels")
            if labels is not None and (
                not isinstance(labels, list) or not all(isinstance(x, str) for x in labels)
            ):
                raise SettingsError(f"{where}.labels must be a list of strings")
            models[model] = ModelSpec(
                model, kind, path, max_length, tuple(labels) if labels else None
            )
        return models

    return parse


def csv(raw: str) -> tuple[str, ...]:
    """The non-empty parts of a comma-separated value, stripped."""
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def labels(name: str) -> Callable[[str], tuple[str, ...]]:
    def parse(raw: str) -> tuple[str, ...]:
        labels = csv(raw)
        if len(labels) < 2:
            raise SettingsError(f"{name} needs at least two comma-separated labels, got {raw!r}")
        return labels

    return parse


def faults(name: str) -> Callable[[str], tuple[str, ...]]:
    def parse(raw: str) -> tuple[str, ...]:
        faults = csv(raw.lower())
        unknown = [f for f in faults if f not in FAULTS]
        if unknown:
            raise SettingsError(
                f"{name} names unknown faults {unknown}; known: {', '.join(FAULTS)}"
            )
        return faults

    return parse


def webhook_url(name: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        url = raw.strip()
        if not url.startswith(("http://", "https://")):
            # Never echo the value: a webhook URL carries its secret in the path.
            raise SettingsError(f"{name} must be an http:// or https:// URL")
        return url

    return parse


def devices(name: str) -> Callable[[str], tuple[str, ...]]:
    def parse(raw: str) -> tuple[str, ...]:
        devices = csv(raw)
        if not devices or not all(d.isdigit() for d in devices):
            raise SettingsError(f"{name} must be comma-separated device numbers, got {raw!r}")
        if len(set(devices)) != len(devices):
            raise SettingsError(f"{name} names a device twice: {raw!r}")
        return devices

    return parse


def rate_limit(name: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        from limits import parse_many

        value = raw.strip()
        try:
            parsed = parse_many(value)
        except ValueError:
            parsed = []
        if not parsed:
            raise SettingsError(
                f"{name} must be a rate limit such as '1000/minute' or '10/second;500/hour', "
                f"got {raw!r}"
            )
        return value

    return parse


def crontab(name: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        spec = " ".join(raw.split())
        if len(spec.split(" ")) != 5:
            raise SettingsError(
                f"{name} must be a crontab of five fields (minute hour day-of-month month "
                f"day-of-week), got {raw!r}"
            )
        from celery.schedules import crontab

        try:
            crontab.from_string(spec)
        except ValueError as exc:
            raise SettingsError(f"{name} is not a valid crontab ({exc}), got {raw!r}") from None
        return spec

    return parse


def mask_url(url: str) -> str:
    """The URL with any password replaced by ***, fit for messages and logs."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


def distinct(
    name: str, what: str, known: Sequence[str], lower: bool = False
) -> Callable[[str], tuple[str, ...]]:
    """A comma-separated list of distinct names among `known` (`what` names them)."""

    def parse(raw: str) -> tuple[str, ...]:
        found = csv(raw.lower() if lower else raw)
        if not found or not set(found) <= set(known) or len(set(found)) != len(found):
            raise SettingsError(
                f"{name} must name distinct {what} among {', '.join(known)}, got {raw!r}"
            )
        return found

    return parse


def served_names(name: str) -> Callable[[str], tuple[str, ...]]:
    """Comma-separated model names for the OpenAI-compatible API: distinct, printable,
    without spaces, and without what a URL path cannot carry (`/v1/models/{id}` does)."""

    def parse(raw: str) -> tuple[str, ...]:
        names = csv(raw)
        for served in names:
            if len(served) > 128 or not all(c.isprintable() and not c.isspace() for c in served):
                raise SettingsError(
                    f"{name} holds {served[:40]!r}: a name is at most 128 printable "
                    "characters without spaces"
                )
            if any(c in served for c in "?#%"):
                raise SettingsError(
                    f"{name} holds {served!r}: '?', '#' and '%' cannot be in a URL path"
                )
        if len(set(names)) != len(names):
            raise SettingsError(f"{name} names a model twice, got {raw!r}")
        return names

    return parse


def database_url(name: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        url = raw.strip()
        # Name the psycopg 3 driver whatever spelling the operator used.
        for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        if url.startswith(("postgresql+psycopg://", "sqlite:///")):
            return url
        raise SettingsError(
            f"{name} must be a postgresql:// or sqlite:/// URL, got {mask_url(url)!r}"
        )

    return parse


def redis_url(name: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        url = raw.strip()
        if not url.startswith(("redis://", "rediss://", "redis+socket://")):
            raise SettingsError(
                f"{name} must be a redis://, rediss:// or redis+socket:// URL, "
                f"got {mask_url(url)!r}"
            )
        return url

    return parse


BROKER_SCHEMES = ("redis://", "rediss://", "redis+socket://", "amqp://", "amqps://")


def broker_url(name: str) -> Callable[[str], str]:
    """The batch lanes' broker: Redis, or RabbitMQ (AMQP 0-9-1, through py-amqp)."""

    def parse(raw: str) -> str:
        url = raw.strip()
        if not url.startswith(BROKER_SCHEMES):
            raise SettingsError(
                f"{name} must be an amqp://, amqps:// (RabbitMQ) or redis://, rediss://, "
                f"redis+socket:// URL, got {mask_url(url)!r}"
            )
        if url.startswith(("amqp://", "amqps://")) and not urlsplit(url).hostname:
            raise SettingsError(f"{name} names no host: {mask_url(url)!r}")
        return url

    return parse


def parsed(parse: Callable[[str], Any]) -> BeforeValidator:
    """Run a variable's own parser on text (the environment); leave values given in code."""
    return BeforeValidator(lambda value: parse(value) if isinstance(value, str) else value)


def lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def stripped(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def anchors(raw: str) -> tuple[str, str]:
    anchors = tuple(a.strip() for a in raw.split("|"))
    if len(anchors) != 2 or not all(anchors):
        raise SettingsError(
            "LANEWAY_SCORE_ANCHORS must be 'positive description|negative description'"
        )
    return anchors  # type: ignore[return-value]


def secret_key(raw: str) -> str:
    secret = raw.strip()
    if secret and len(secret) < MIN_SECRET_KEY_CHARS:
        raise SettingsError(
            f"LANEWAY_SECRET_KEY must be at least {MIN_SECRET_KEY_CHARS} characters "
            f"(it has {len(secret)}); try: python -c 'import secrets; "
            "print(secrets.token_urlsafe(48))'"
        )
    return secret


def not_a_variable(raw: str) -> Any:
    raise SettingsError(
        "LANEWAY_ACCOUNT_LIMITS is not a variable: set LANEWAY_RATE_LIMIT_<TYPE>, "
        "LANEWAY_MAX_ITEMS_<TYPE> or LANEWAY_MAX_UPLOAD_BYTES_<TYPE>"
    )


def var(name: str) -> str:
    return f"LANEWAY_{name.upper()}"


# The types of the variables, each once: pydantic parses and bounds them, and from_env
# turns its errors into a sentence naming the variable.
Count = Annotated[int, Field(ge=1)]  # at least 1
Natural = Annotated[int, Field(ge=0)]  # at least 0
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Price = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Csv = NoDecode  # comma-separated in the environment, not JSON
# A switch reads 1/true/yes/on or 0/false/no/off, any case, blanks around it ignored; strict
# past that: pydantic's own extras (t, f, y, n) are refused, so a stray letter is an error
# rather than a guess.
SWITCHES = {"1": True, "true": True, "yes": True, "on": True}
SWITCHES |= {"0": False, "false": False, "no": False, "off": False}


def switch(value: Any) -> Any:
    if isinstance(value, str):
        return SWITCHES.get(value.strip().lower(), value)
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    return value


Switch = Annotated[bool, Strict(), BeforeValidator(switch)]
Lanes = Literal["cpu", "gpu"]


# How pydantic's errors read, with the variable named first.
_MESSAGES = {
    "int_parsing": "must be an integer, got {input!r}",
    "int_from_float": "must be an integer, got {input!r}",
    "int_type": "must be an integer, got {input!r}",
    "float_parsing": "must be a number, got {input!r}",
    "finite_number": "must be a number, got {input!r}",
    "bool_parsing": "must be true or false, got {input!r}",
    "bool_type": "must be true or false, got {input!r}",
    "greater_than_equal": "must be at least {ge}, got {input}",
    "less_than_equal": "must be at most {le}, got {input}",
    "literal_error": "must be one of {choices}, got {input!r}",
}
# A variable whose bound reads better in its own words.
_FIELD_MESSAGES = {
    ("batch_nice", "less_than_equal"): "must be a niceness from 0 to 19, got {input}",
    **{
        ("cpu_workers", kind): "must be a count of workers (0 or more) or auto, got {input!r}"
        for kind in ("int_parsing", "int_from_float")
    },
}


def _as_number(raw: Any, bound: Any) -> Any:
    """The number an out-of-bounds variable was read as (` 42 ` as 42, `1e2` as 100.0)."""
    try:
        return float(raw) if isinstance(bound, float) else int(raw)
    except (TypeError, ValueError):
        return raw


def named(exc: ValidationError) -> SettingsError:
    """The first error as a sentence naming the variable (never echoing a secret: only
    plain numbers, switches and choices are quoted)."""
    error = exc.errors(include_url=False)[0]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, SettingsError):
        return cause
    loc = [str(part) for part in error["loc"]]
    field = loc[0] if loc else ""
    name = field if field.startswith("LANEWAY_") else var(field)
    ctx = dict(error.get("ctx") or {})
    if error["type"] == "literal_error":
        ctx["choices"] = ", ".join(re.findall(r"'([^']*)'", str(ctx.get("expected", ""))))
    value = error.get("input")
    if error["type"] in ("greater_than_equal", "less_than_equal"):
        value = _as_number(value, ctx.get("ge", ctx.get("le")))
    template = _FIELD_MESSAGES.get((field, error["type"])) or _MESSAGES.get(error["type"])
    if template is None:
        return SettingsError(f"{name}: {error['msg']}")
    return SettingsError(f"{name} " + template.format(input=value, **ctx))
