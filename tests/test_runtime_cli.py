"""`moepack plan / run / eval / chat` on a tiny converted Mixtral (word-level tokenizer)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from moepack.runtime.engine import Engine, plan
from moepack.runtime.tokenizer import StreamDecoder, Tokenizer
from tiny_models import make_checkpoint
from typer.testing import CliRunner

from moepack.cli import app
from moepack.sizes import format_size

runner = CliRunner()
STATS = re.compile(r"prompt \d+ tok @ [\d.]+ tok/s \| decode \d+ tok @ [\d.]+ tok/s \| "
                   r"cache hits [\d.]+% \| read [\d.]+ (B|kB|MB|GB|TB) \| I/O wait [\d.]+% \| "
                   r"O_DIRECT (on|off)")


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    d = tmp_path_factory.mktemp("cli")
    make_checkpoint("mixtral", d / "src", max_position_embeddings=128)
    convert(d / "src", d / "m.moepack", Settings())
    return d / "m.moepack"


def _run(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def test_plan_json_and_refusal(mixtral):
    r = _run("plan", mixtral, "--ctx", 32, "--json")
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    assert p["ctx"] == 32 and p["floor_bytes"] == (p["trunk_bytes"] + p["kv_bytes"] +
                                                   p["scratch_bytes"] + p["pinned_expert_bytes"])
    assert p["floor_bytes"] <= p["recommended_bytes"]
    assert p["floor_bytes"] <= p["default_bytes"] <= p["usable_ram_bytes"]
    r = _run("plan", mixtral, "--budget", "1K")
    assert r.exit_code == 1 and "below the floor" in r.output
    r = _run("plan", mixtral)
    assert r.exit_code == 0 and "floor" in r.output and "default budget" in r.output
    # the expert cache line says when the default cache holds every expert (the warm-up runs)
    holds = {}
    for ram in (None, p["floor_bytes"] + p["experts_bytes"] // 2):
        extra = ("--ram", ram) if ram else ()
        q = json.loads(_run("plan", mixtral, "--ctx", 32, *extra, "--json").output)
        text = _run("plan", mixtral, "--ctx", 32, *extra).output
        holds[ram] = q["default_cache_bytes"] >= q["experts_bytes"]
        assert ("read in the background" in text) == holds[ram], text
    assert holds == {None: True, p["floor_bytes"] + p["experts_bytes"] // 2: False}


def test_plan_budget_shows_what_that_budget_gets(mixtral):
    """plan --budget B: the chunk and cache an engine opened with B gets (not the default's)."""
    from moepack.runtime.engine import Engine

    p = json.loads(_run("plan", mixtral, "--ctx", 128, "--json").output)
    budget = p["floor_bytes"] + 40 * p["chunk_token_bytes"] + 2 * p["expert_record_bytes"]
    q = json.loads(_run("plan", mixtral, "--ctx", 128, "--budget", budget, "--json").output)
    with Engine(mixtral, ctx=128, budget=budget) as e:
        s = e.stats()
    assert (q["budget_chunk"], q["budget_cache_bytes"]) == (s["chunk"], s["cache_capacity_bytes"])
    assert q["budget_chunk"] != q["default_chunk"]
    text = _run("plan", mixtral, "--ctx", 128, "--budget", budget).output
    assert f"{s['chunk']}-token chunks" in text.split("with --budget")[1]
    assert "with --budget" not in _run("plan", mixtral, "--ctx", 128).output


def test_run_streams_text_then_stats(mixtral):
    r = _run("run", mixtral, "w5 w9 w12", "-n", 8, "--threads", 1)
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert STATS.fullmatch(lines[-1]), lines[-1]
    assert "prompt 4 tok" in lines[-1]  # <s> w5 w9 w12: BOS added (the tokenizer adds none)


def test_run_json_matches_engine_greedy(mixtral):
    r = _run("run", mixtral, "--tokens", "5,9,12", "-n", 6, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    with Engine(mixtral) as e:
        want = list(e.generate([5, 9, 12], 6, stop=[2]))
    assert out["tokens"] == want and out["prompt_tokens"] == [5, 9, 12]
    keys = {"decode_tok_s", "hit_rate", "bytes_read", "io_wait_share", "o_direct"}
    assert keys <= set(out["stats"])


def test_run_refuses_budget_below_floor(mixtral):
    r = _run("run", mixtral, "w5", "--budget", "1K")
    assert r.exit_code == 1
    assert "below the floor" in r.output and "needs at least" in r.output
    assert f"budget {format_size(1000)} is below" in r.output  # plan's unit, not 0.000 GB


def test_budget_one_byte_below_the_floor_reads_below_it(mixtral):
    """The two amounts of the refusal differ where the bytes do, and --json gives the refusal's
    stable code and the longest context that fits that budget (as `plan --budget` plans it)."""
    floor = json.loads(_run("plan", mixtral, "--ctx", 64, "--json").output)["floor_bytes"]
    budget = floor - 1
    r = _run("run", mixtral, "w5", "--ctx", 64, "--budget", budget)
    assert r.exit_code == 1, r.output
    m = re.search(r"budget ([\d.]+ \w+) is below the floor: this model needs at least "
                  r"([\d.]+ \w+)", r.output)
    assert m and m[1] != m[2], r.output
    r = _run("run", mixtral, "w5", "--ctx", 64, "--budget", budget, "--json")
    err = json.loads(r.output)["error"]
    fits = plan(str(mixtral), 64, budget=budget)["max_ctx"]
    assert (r.exit_code, err["code"], err["max_ctx"]) == (1, "budget_too_small", fits), err
    assert 0 < err["max_ctx"] < 64


def test_ctx_beyond_the_models_longest_is_a_context_refusal(mixtral):
    r = _run("run", mixtral, "w5", "--ctx", 129, "--json")  # max_position_embeddings 128
    err = json.loads(r.output)["error"]
    assert (r.exit_code, err["code"], err["max_ctx"]) == (1, "context_too_long", 128), err


def test_run_names_damaged_expert_with_verify_reads(mixtral, tmp_path):
    from moepack.format.reader import Container

    bad = tmp_path / "bad.moepack"
    bad.write_bytes(mixtral.read_bytes())
    with Container.open(bad) as c:
        offs = [c.expert_range(0, e)[0] for e in range(c.model["moe"]["num_experts"])]
    with open(bad, "r+b") as f:
        for off in offs:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 1]))
    r = _run("run", bad, "w5 w6", "-n", 2, "--verify-reads")
    assert r.exit_code == 1
    assert re.search(r"layer 0 expert \d", r.output), r.output


def test_eval_writes_logits(mixtral, tmp_path):
    out = tmp_path / "l.npy"
    toks = [3 + i % 64 for i in range(67)]  # 67 positions
    r = _run("eval", mixtral, "--tokens", ",".join(map(str, toks)), "--logits", out,
             "--threads", 2)
    assert r.exit_code == 0, r.output
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == (67, 67)
    with Engine(mixtral, threads=1) as e:
        assert np.array_equal(got, e.logits(toks))


def test_chat_keeps_the_kv_cache_across_turns(mixtral, monkeypatch):
    fed: list[int] = []
    real_feed = Engine.feed

    def feed(self, tokens):
        fed.append(len(tokens))
        return real_feed(self, tokens)

    monkeypatch.setattr(Engine, "feed", feed)
    r = _run("chat", mixtral, "-n", 4, input="w5 w6\nw7 w8\n\n")
    assert r.exit_code == 0, r.output
    assert r.output.count("> ") >= 3
    prompts = [n for n in fed if n > 1]
    assert prompts[0] == 2  # turn 1: "w5 w6"
    # turn 2 evaluates only what is not cached: the last sampled token (never fed) + "w7 w8",
    # not the whole re-rendered conversation (>= 2 + 1 + 2 tokens)
    assert len(prompts) == 2 and prompts[1] <= 3


def test_chat_starting_over_keeps_the_system_message(mixtral, monkeypatch):
    rendered: list[list[dict]] = []
    real = Tokenizer.encode_chat

    def encode_chat(self, messages):
        rendered.append([dict(m) for m in messages])
        return real(self, messages)

    monkeypatch.setattr(Tokenizer, "encode_chat", encode_chat)
    turns = "".join(f"w{i} w{i + 1} w{i + 2}\n" for i in range(5, 35, 3)) + "\n"
    r = _run("chat", mixtral, "-n", 4, "--ctx", 24, "--system", "w1 w2", input=turns)
    assert r.exit_code == 0, r.output
    assert "starting over" in r.output
    assert all(m[0] == {"role": "system", "content": "w1 w2"} for m in rendered), rendered


def test_run_refuses_a_prompt_and_n_longer_than_ctx_before_generating(mixtral):
    """prompt + n - 1 positions (the last token is never fed): refused up front, so that --json
    never loses the tokens made before the context fills."""
    r = _run("run", mixtral, "--tokens", "5,9,12", "-n", 6, "--ctx", 8, "--json")
    assert r.exit_code == 0, r.output  # 3 + 6 - 1 = 8 positions fit
    r = _run("run", mixtral, "--tokens", "5,9,12", "-n", 7, "--ctx", 8, "--json")
    assert r.exit_code == 1
    err = json.loads(r.output)["error"]
    assert "9 positions" in err["message"] and err["engine_code"] == -8, err
    assert err["code"] == "context_too_long" and "--ctx" in err["message"], err


def test_context_full_at_the_models_longest_does_not_suggest_ctx(mixtral):
    """At max_position_embeddings (128) a longer --ctx is refused too: the line says so."""
    r = _run("run", mixtral, "--tokens", ",".join(["5"] * 120), "-n", 10)
    assert r.exit_code == 1
    assert "129 positions, ctx is 128, this model's longest context" in r.output, r.output
    assert "--ctx" not in r.output, r.output


def test_kernels_option_gives_the_same_logits_on_every_path(mixtral, tmp_path):
    """--kernels picks the compute path (run --json names it); every path gives the same bits."""
    from moepack.runtime.cli import KERNEL_PATHS
    from moepack.runtime.engine import KERNELS, available_kernels

    assert KERNEL_PATHS == tuple(KERNELS)
    toks = ",".join(str(3 + i % 64) for i in range(40))
    logits = {}
    for k in available_kernels():
        r = _run("eval", mixtral, "--tokens", toks, "--logits", tmp_path / f"{k}.npy",
                 "--kernels", k)
        assert r.exit_code == 0, r.output
        logits[k] = np.load(tmp_path / f"{k}.npy")
        r = _run("run", mixtral, "--tokens", "5", "-n", 1, "--kernels", k, "--json")
        assert k == "auto" or json.loads(r.output)["stats"]["kernels"] == k, r.output
    assert "scalar" in logits and all(np.array_equal(v, logits["auto"]) for v in logits.values())


def test_kernels_this_cpu_lacks_are_refused_in_one_line(mixtral, monkeypatch):
    from moepack.runtime.engine import KERNELS, _library

    lib = _library()
    real = lib.mp_kernels_available
    monkeypatch.setattr(lib, "mp_kernels_available",
                        lambda k: 0 if k == KERNELS["avx512amx"] else real(k))
    r = _run("run", mixtral, "w5", "--kernels", "avx512amx")
    lines = r.output.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1, r.output
    assert "kernels avx512amx" in lines[0] and "scalar" in lines[0], r.output


def test_budget_above_usable_ram_warns(mixtral):
    r = _run("plan", mixtral, "--budget", "1000T")
    assert r.exit_code == 0 and "above usable RAM" in r.output


def test_tokenizer_and_chat_template(mixtral):
    tok = Tokenizer.from_container(str(mixtral))
    ids = tok.encode("w5 w9 w12")
    assert ids == [5, 9, 12] and tok.decode(ids) == "w5 w9 w12" and tok.eos_id == 2
    assert tok.encode_prompt("w5 w9 w12") == [1, 5, 9, 12]
    tok.config["add_bos_token"] = False
    assert tok.encode_prompt("w5") == [5]
    msgs = [{"role": "user", "content": "w5"}, {"role": "assistant", "content": "w6"}]
    assert tok.render_chat(msgs) == "w5 w6 "
    d = StreamDecoder(tok)
    assert "".join(d.push(t) for t in ids) == "w5 w9 w12"
