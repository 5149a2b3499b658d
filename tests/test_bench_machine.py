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
    assert machine.lscpu().get("Model name", machine.cpu_model()) == machine.cpu_model()


def test_cpu_model_names_family_and_model(tmp_path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                    "model name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\n")
    assert machine.cpu_model(info) == "AMD EPYC (family 25, model 17)"
    assert machine.cpu_simd_flags(info) == []
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 fma avx512f\n\n"
                    "processor\t: 1\nflags\t\t: amx_int8\n")
    assert machine.cpu_model(info) == "Some CPU"
    assert machine.cpu_simd_flags(info) == ["avx2", "fma", "avx512f"]
