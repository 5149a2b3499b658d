"""The one size grammar and printer (moepack/sizes.py) and the commands that use them."""

from __future__ import annotations

import pytest
from moepack.runtime.engine import parse_bytes

from moepack import cliargs
from moepack.sizes import format_size, parse_size


@pytest.mark.parametrize("text, n", [
    ("4096", 4096), ("0", 0), ("12B", 12), (" 3 kb ", 3000), ("2K", 2000), ("2Ki", 2048),
    ("2KiB", 2048), ("16M", 16 * 10**6), ("16mi", 16 << 20), ("16MiB", 16 << 20),
    ("8G", 8 * 10**9), ("8gib", 8 << 30), ("1T", 10**12), ("1TiB", 1 << 40),
    ("1.5GiB", 3 << 29), ("0.1k", 100), (".5K", 500), ("1.0005k", 1000),  # rounded down
    ("99999999999999999999T", 99999999999999999999 * 10**12),  # exact, no float rounding
])
def test_grammar(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "G", "-1G", "1e9", "nanG", "inf", "1.2.3", "8 bananas",
                                  "8GBi", "8gig", "1,000", "\x1b[31m8G"])
def test_refusals_name_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="as a size") as e:
        parse_size(text)
    assert "\x1b" not in str(e.value) and "\n" not in str(e.value)


def test_every_command_parses_with_it() -> None:
    """run/plan/serve --budget (cliargs, engine), convert --staging and torrent --piece-size
    (moepack.sizes imported directly) read the same grammar: 16Ki was refused by --budget and
    1.5G by --piece-size before."""
    assert cliargs.parse_size is parse_size
    assert parse_bytes("16Ki") == 16384 and parse_bytes("1.5G") == 1_500_000_000


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (999, "999 B"), (1000, "1.000 kB"), (16384, "16.384 kB"),
    (7_162_596, "7.163 MB"), (999_999_600, "1.000 GB"), (321_285_426_559, "321.285 GB"),
    (2 * 10**15, "2000.000 TB"), (-1500, "-1.500 kB"),
])
def test_printer(n: int, text: str) -> None:
    assert format_size(n) == text
