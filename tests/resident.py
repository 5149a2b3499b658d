"""Peak growth of a fresh process's anonymous memory while an engine opens, takes a prompt and
decodes: what a memory budget must hold. The process imports no torch; file-backed pages (the
engine's code, loaded before the baseline) are shared and reclaimable, not the budget's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

# the child's start: anonymous memory as (peak, now) from /proc, the engine library loaded, the
# baseline taken
_PRELUDE = """import json, re
from moepack.runtime.engine import Engine, _library
def anon():
    text = open("/proc/self/status").read()
    kb = lambda key: 1024 * int(re.search(key + r":\\s+(\\d+)", text).group(1))
    return kb("VmHWM") - kb("RssFile"), kb("VmRSS") - kb("RssFile")
_library()
base = anon()[1]
"""


def peak_growth(path: Path, prompt: list[int], decode: int, **engine: object) -> dict:
    """{"peak": bytes of growth, "stats": the engine's stats at the end} for Engine(path,
    **engine) fed `prompt` in one call, then `decode` single tokens."""
    code = _PRELUDE + textwrap.dedent(f"""
        with Engine({str(path)!r}, **{engine!r}) as e:
            e.feed({prompt!r})
            for t in range({decode}):
                e.feed([1 + t % 3])
            s = e.stats()
        print(json.dumps({{"peak": anon()[0] - base, "stats": s}}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def resident_after(path: Path, prompts: list[list[int]], **engine: object) -> dict:
    """{"now": anonymous memory's growth once the prompts are done, "peak": its peak growth,
    "stats"} for Engine(path, **engine) fed each prompt in one call from an empty sequence."""
    code = _PRELUDE + textwrap.dedent(f"""
        with Engine({str(path)!r}, **{engine!r}) as e:
            for p in {prompts!r}:
                e.reset()
                e.feed(p)
            s = e.stats()
            peak, now = anon()
        print(json.dumps({{"now": now - base, "peak": peak - base, "stats": s}}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)
