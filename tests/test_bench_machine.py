"""bench/machine.py: the one place benchmarks read commit, date and CPU facts from."""

from __future__ import annotations

import os
import re

from bench import machine


def test_machine_record_helpers() -> None:
    assert re.fullmatch(r"([0-9a-f]{7,}(\+dirty)?|unknown)", machine.git_commit())
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", machine.utc_now())
    assert set(machine.cpu_simd_flags()) <= set(machine.SIMD_FLAGS)
    line = machine.machine_line()
    assert f", {os.cpu_count()} CPUs, " in line and machine.cpu_model() in line
    assert machine.lscpu()["kernel"] in line
