"""JSON responses of the interactive endpoints, encoded by orjson (core/util/jsoncodec.py).

Flask's `jsonify` goes through the stdlib's encoder, which spends a noticeable share of the
web process's CPU on an answer's hundreds of floats. The body is the same JSON value; only
its form differs (keys in the order given, non-ASCII written as UTF-8, floats in their
shortest form).
"""

from __future__ import annotations

from typing import Any

from flask import Response

from core.util.jsoncodec import dumps_bytes


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(dumps_bytes(payload), status=status, mimetype="application/json")
