"""The errors the client raises: one type, with the server's status, code and message."""

from __future__ import annotations

import httpx


class LanewayError(RuntimeError):
    """An error answer: `status` (0 when no answer came), the server's `code` (e.g.
    invalid_input, not_found) and `message`, which names the problem."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}" if status else message)
        self.status, self.code, self.message = status, code, message


class LanewayConnectionError(LanewayError):
    """No answer: the server refused the connection, dropped it or did not answer in time,
    and the retries ran out."""

    def __init__(self, url: str, cause: Exception) -> None:
        reason = str(cause) or type(cause).__name__
        super().__init__(0, "connection_error", f"cannot reach Laneway at {url}: {reason}")


ClientError = LanewayError  # the name the CLI used before


def error_from(response: httpx.Response) -> LanewayError:
    """The server's code and message, from Laneway's or OpenAI's error shape."""
    try:
        body = response.json()
    except ValueError:
        return LanewayError(response.status_code, "http_error", response.text[:500])
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):  # OpenAI's shape (/v1/embeddings)
        return LanewayError(response.status_code, str(error.get("code")), error.get("message"))
    message = body.get("message", response.text) if isinstance(body, dict) else response.text
    return LanewayError(response.status_code, str(error or "http_error"), message)
