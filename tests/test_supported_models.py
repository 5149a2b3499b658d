"""README's supported-models table, docs/CONVERT.md's conversion-time estimates and the K3 plan
figures are the planner's output for docs/configs/ (real configs)."""

from __future__ import annotations

import json
from pathlib import Path

from moepack.convert.plan import described

from bench import convert_rates

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "docs" / "configs"


def test_readme_table_is_the_planners():
    table = convert_rates.supported_models().table()
    assert table in (ROOT / "README.md").read_text()
    assert table.count("\n") == 1 + len(list(CONFIGS.glob("*.json")))


def test_real_configs_describe_as_expected():
    glm = described(json.loads((CONFIGS / "GLM-4.5.json").read_text())).model
    assert glm["attention"] == {"kind": "gqa", "rotary_dim": 64, "qkv_bias": True}
    assert glm["layer_kinds"][:4] == ["dense"] * 3 + ["moe"] and glm["qk_norm"] is True
    mm = described(json.loads((CONFIGS / "MiniMax-M2.json").read_text())).model
    assert mm["attention"] == {"kind": "gqa", "rotary_dim": 64, "qk_norm_scope": "all_heads"}
    kimi = described(json.loads((CONFIGS / "Kimi-K2.5.json").read_text()))
    assert kimi.model["moe"]["num_experts"] == 384 and kimi.model["hidden_size"] == 7168
    assert kimi.model["rope_scaling"]["factor"] == 64.0
    assert any("vision tower" in s for s in kimi.skipped())
    lin = described(json.loads((CONFIGS / "Kimi-Linear-48B-A3B.json").read_text())).model
    assert lin["layer_attention"].count("linear") == 20 and lin["layer_attention"][3] == "full"
    assert lin["linear_attention"] == {"kind": "kda", "num_heads": 32, "head_dim": 128,
                                       "conv_kernel_size": 4}
    assert lin["attention"]["rope"] is False and lin["max_position_embeddings"] == 1 << 20


def test_k3_64gb_plan_in_readme_and_k3_md():
    """The Kimi K3 figures README.md and docs/K3.md quote for a 64 GB machine are what
    `moepack plan --config docs/configs/Kimi-K3.json --ram 64G --threads 8` prints (default
    codecs)."""
    from typer.testing import CliRunner

    from moepack.cli import app

    args = ["plan", "--config", str(CONFIGS / "Kimi-K3.json"), "--ram", "64G", "--threads", "8"]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    floor, step, default, cache = (p[k] for k in ("floor_bytes", "step_expert_bytes",
                                                  "default_bytes", "default_cache_bytes"))

    def gb(n: int) -> str:
        return f"{n / 1e9:.1f} GB"

    readme = (ROOT / "README.md").read_text()
    assert (f"Kimi K3 at 64 GB with 8 threads: floor {gb(floor)}, {gb(step)} of experts per "
            f"cold token, default budget {gb(default)}, expert cache {gb(cache)}") in readme
    k3 = (ROOT / "docs" / "K3.md").read_text()
    command = "$ moepack plan --config docs/configs/Kimi-K3.json --ram 64G --threads 8\n"
    block = k3.split(command, 1)[1].split("```", 1)[0].splitlines()
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    printed = [line.rstrip() for line in r.output.splitlines()]
    assert [line for line in block if line.rstrip() not in printed] == []
    assert {"floor", "default budget", "expert cache"} <= {line.strip().split("  ")[0]
                                                           for line in block}
    # with 16-token prompt chunks the cache is all the room above the floor
    assert (f"expert cache of {gb(cache)} ({gb(default - floor)} with 16-token prompt chunks"
            in " ".join(k3.split()))
    assert f"{cache / step:.2f} of one cold token's {gb(step)} of experts" in " ".join(k3.split())


def test_convert_md_time_estimates_are_the_generators():
    """docs/CONVERT.md's rates and estimates section is what bench.convert_rates prints from
    the recorded rates (one row per config), and README's figures are its figures."""
    body = convert_rates.section()
    marked = f"<!-- bench-convert-rates:begin -->\n\n{body}\n\n<!-- bench-convert-rates:end -->"
    assert marked in (ROOT / "docs" / "CONVERT.md").read_text()
    table = body.split("| model | expert weights |", 1)[1].splitlines()[2:]
    assert len(table) == len(list(CONFIGS.glob("*.json")))
    assert "| 3584x3072: not measured, 7168x2048's, 3.52 M/s |" in table[-1]  # K3's latent
    rates, _ = convert_rates.recorded()
    work = convert_rates.model_work()

    def took(name: str, cores: int) -> str:
        w = work[name]
        return convert_rates.format_hours(convert_rates.hours(
            w, convert_rates.rate_for(rates, "rvq3-l", w), cores))

    ds, k3 = "DeepSeek-V3.2", "Kimi K3 (config partly assumed: docs/K3.md)"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (f"DeepSeek-V3.2's {work[ds].weights / 1e9:.0f} G expert weights (its MTP layer "
            f"included) take about {took(ds, 2)} on 2 cores, {took(ds, 16)} on 16 and "
            f"{took(ds, 64)} on 64, and Kimi K3's {work[k3].weights / 1e9:.0f} G about "
            f"{took(k3, 2)} on 2 cores and {took(k3, 64)} on 64") in readme
