"""Server-sent events as the OpenAI API sends them: `data: {json}` lines, blank-line separated,
ending with `data: [DONE]` (sse-starlette does the framing, keep-alive and disconnects)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse


def data(obj: dict | str) -> dict:
    return {"data": obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}


def response(events: AsyncIterator[dict]) -> EventSourceResponse:
    # sep "\n": the API's own framing ("data: ...\n\n"), not sse-starlette's default "\r\n"
    return EventSourceResponse(events, sep="\n", ping=15,
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
