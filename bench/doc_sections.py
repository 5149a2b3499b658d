"""Generated sections of a hand-kept document: each benchmark owns the text between its own
`<!-- bench-NAME:begin -->` / `<!-- bench-NAME:end -->` markers and leaves the rest alone."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, name: str, body: str) -> None:
    """Put `body` between the markers of `name` in `path` (appended when they are missing)."""
    begin, end = f"<!-- bench-{name}:begin -->", f"<!-- bench-{name}:end -->"
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n\n{body.strip(chr(10))}\n\n{end}\n"  # blank lines: Markdown blocks
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block
    path.write_text(text)
