"""The app's request class: a body sent without a length (`Transfer-Encoding: chunked`)
that runs past the body limit is refused as too large. Werkzeug's `get_data` stops
reading such a stream at `max_content_length` and returns what it read, so the rest was
cut off in silence and the view saw a truncated body (a JSON error naming column
67,108,865, not the limit)."""

from __future__ import annotations

from flask import Request


class LanewayRequest(Request):
    def get_data(  # type: ignore[override]
        self, cache: bool = True, as_text: bool = False, parse_form_data: bool = False
    ) -> bytes | str:
        data = super().get_data(cache=cache, as_text=False, parse_form_data=parse_form_data)
        limit = self.max_content_length
        if self.content_length is None and limit is not None and len(data) >= limit:
            # At the limit with no length given: Werkzeug's limited stream raises
            # RequestEntityTooLarge on a read past it (the 413 handler names the limit).
            # It cannot tell a body of exactly the limit from a longer one: both go.
            self.stream.read(1)
        return data.decode(errors="replace") if as_text else data
