"""Server-sent events as the OpenAI API sends them: `data: {json}` lines, blank-line separated,
ending with `data: [DONE]` (sse-starlette does the framing, keep-alive and disconnects)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse

# When the server stops, sse-starlette cancels every stream; the grace lets ours end itself
# first with an error event and `data: [DONE]` (app.Server.stop_requests).
_GRACE_S = 3.0


def data(obj: dict | str | bytes) -> bytes:
    """One event, framed here: sse-starlette passes bytes through as they are (its own encoder
    costs more per token than the rest of the server's work). JSON has no raw newlines, so the
    payload is always a single `data:` line."""
    if isinstance(obj, bytes):
        return b"data: " + obj + b"\n\n"
    text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return b"data: " + text.encode() + b"\n\n"


def response(events: AsyncIterator[bytes]) -> EventSourceResponse:
    # sep "\n": the API's own framing ("data: ...\n\n"), not sse-starlette's default "\r\n"
    return EventSourceResponse(events, sep="\n", ping=15, shutdown_grace_period=_GRACE_S,
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
