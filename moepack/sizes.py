"""Byte sizes for people: the one parser and the one printer every command uses.

Grammar (SIZE_HELP repeats it for --help texts): a number, digits with at most one decimal
point, then an optional unit, case-insensitive, spaces allowed around both. `B` or nothing:
bytes; `k`/`kB`, `M`/`MB`, `G`/`GB`, `T`/`TB`: powers of 1000; `Ki`/`KiB`, `Mi`/`MiB`, `Gi`/`GiB`,
`Ti`/`TiB`: powers of 1024. Fractions are computed exactly and rounded down to whole bytes
(1.5KiB = 1536). No exponents, signs, NaN or infinity.

Printing is decimal (kB, MB, GB, TB, like the C engine's messages and the disk sizes vendors
state), three decimals: `7.163 MB`; up to six where a refusal compares two amounts.
"""

from __future__ import annotations

import re

from moepack.safefs import printable

SIZE_HELP = ("Sizes: 8G = 8 GB = 8*10^9 bytes, 8Gi = 8GiB = 8*2^30; k/M/G/T, fractions allowed "
             "(1.5G).")

_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgt", start=1):
    _UNITS.update({_p: 1000**_i, _p + "b": 1000**_i, _p + "i": 1024**_i, _p + "ib": 1024**_i})
_SIZE = re.compile(r"\s*([0-9]{1,20}(?:\.[0-9]{1,20})?|\.[0-9]{1,20})\s*([a-zA-Z]{0,3})\s*")


def parse_size(text: str) -> int:
    """'8G', '512MiB', '1.5gb', '16 Ki' or a plain byte count -> bytes. ValueError naming the
    text and what is accepted otherwise."""
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"cannot read {printable(text, 40)} as a size "
                         "(examples: 8G, 512MiB, 1.5GB, 4096)")
    whole, _, frac = m.group(1).partition(".")
    scale = _UNITS[unit]
    # exact integer arithmetic: float() would round sizes above 2**53
    return int(whole or "0") * scale + int(frac or "0") * scale // 10 ** len(frac)


def format_size(n: float, exact: bool = False) -> str:
    """Decimal units, three decimals: `512 B`, `2.459 MB`, `321.285 GB` (negative: `-1.000 kB`).

    `exact` (whole bytes): up to six decimals where three would hide a remainder, `6.469338 MB`,
    so that two amounts a refusal compares never read the same; the engine's messages
    (engine.c fmt_size) follow the same rule."""
    value = float(n)
    if abs(value) < 1000:
        return f"{value:.0f} B"
    scale = 1
    for unit in ("kB", "MB", "GB", "TB"):
        scale *= 1000
        if abs(round(value / scale, 3)) < 1000 or unit == "TB":  # 999.9996 kB prints as 1.000 MB
            break
    decimals, step = 3, scale // 1000
    while exact and decimals < 6 and int(n) % step:
        decimals, step = decimals + 1, step // 10
    return f"{value / scale:.{decimals}f} {unit}"
