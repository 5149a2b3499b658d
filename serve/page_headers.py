"""Response headers for the chat page at /: a Content-Security-Policy that lets run only the
page's own inline script and style (by hash, so the page stays one file), reach only this
origin, and never be framed; and the usual hardening headers."""

from __future__ import annotations

import base64
import functools
import hashlib
import re

_INLINE = re.compile(rb"<(script|style)\b[^>]*>(.*?)</\1>", re.S | re.I)


def _sha256(block: bytes) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(block).digest()).decode() + "'"


@functools.lru_cache(maxsize=1)
def page_headers(page: bytes) -> dict[str, str]:
    """The headers to send with `page` (the bytes of serve/static/index.html)."""
    found: dict[bytes, list[str]] = {b"script": [], b"style": []}
    for m in _INLINE.finditer(page):
        found[m.group(1).lower()].append(_sha256(m.group(2)))
    csp = "; ".join([
        "default-src 'none'",
        "script-src " + (" ".join(found[b"script"]) or "'none'"),
        "style-src " + (" ".join(found[b"style"]) or "'none'"),
        "connect-src 'self'",  # the API, same origin
        "base-uri 'none'",
        "form-action 'none'",  # the form is sent by the script, never navigated
        "frame-ancestors 'none'",  # no clickjacking through a frame
    ])
    return {"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff",
            "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"}
