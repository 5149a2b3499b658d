"""Sizes people read go through moepack.sizes.format_size (issue 20: one printer)."""

from __future__ import annotations

from moepack.runtime.cli import stats_line

from moepack.sizes import format_size


def _stats(bytes_read: int) -> dict:
    return {"prompt_tokens": 3, "prompt_tok_s": 1.5, "decode_tokens": 4, "decode_tok_s": 2.0,
            "hit_rate": 0.25, "bytes_read": bytes_read, "io_wait_share": 0.1, "o_direct": 0}


def test_run_stats_line_prints_bytes_read_with_the_one_printer() -> None:
    for n in (512, 7_340_032, 321_285_000_000):
        line = stats_line(_stats(n))
        assert f"| read {format_size(n)} |" in line
    assert "| read 512 B |" in stats_line(_stats(512))  # not "0.000 GB"
