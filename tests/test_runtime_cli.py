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


def test_eval_ctrl_c_stops_the_pass_and_writes_nothing(mixtral, tmp_path, monkeypatch):
    """Ctrl-C reaches the engine's cancel (Cancelled): exit 130, no .npy of a stopped pass."""
    import signal

    from moepack.runtime.engine import Cancelled

    def logits(self, tokens, **kw):
        signal.raise_signal(signal.SIGINT)
        raise Cancelled("cancelled", -10)

    monkeypatch.setattr(Engine, "logits", logits)
    out = tmp_path / "l.npy"
    r = _run("eval", mixtral, "--tokens", "3,4,5", "--logits", out)
    assert r.exit_code == 130 and "interrupted" in r.stderr, r.output
    assert not out.exists()


def test_chat_keeps_the_kv_cache_across_turns(mixtral, monkeypatch):
    fed: list[int] = []
    real_feed = Engine.feed

    def feed(self, tokens):
        fed.append(len(tokens))
        return real_feed(self, tokens)

    monkeypatch.setattr(Engine, "feed", feed)
    r = _run("chat", mixtral, "-n", 4, input="w5 w6\nw7 w8\n\n")
    assert r.exit_code == 0, r.output
    assert len(r.stdout.splitlines()) == 2  # a line per reply
    prompts = [n for n in fed if n > 1]
    assert prompts[0] == 2  # turn 1: "w5 w6"
    # turn 2 evaluates only what is not cached: the last sampled token (never fed) + "w7 w8",
    # not the whole re-rendered conversation (>= 2 + 1 + 2 tokens)
    assert len(prompts) == 2 and prompts[1] <= 3


def test_chat_without_a_terminal_writes_only_the_replies(mixtral):
    """stdin a file, a pipe or /dev/null: no "> " prompts in stdout (nor a last one left
    without its newline), so that a program reading stdout gets the replies alone."""
    r = _run("chat", mixtral, "-n", 3, input="w5 w6\nw7")  # the last line without its newline
    assert r.exit_code == 0, r.output
    assert ">" not in r.stdout and len(r.stdout.splitlines()) == 2, r.stdout
    assert r.stdout.endswith("\n")
    r = _run("chat", mixtral, input="")
    assert r.exit_code == 0 and r.stdout == "", r.output


def _recording_encode_chat(monkeypatch) -> list[list[dict]]:
    """Every message list chat renders, in order."""
    rendered: list[list[dict]] = []
    real = Tokenizer.encode_chat

    def encode_chat(self, messages):
        rendered.append([dict(m) for m in messages])
        return real(self, messages)

    monkeypatch.setattr(Tokenizer, "encode_chat", encode_chat)
    return rendered


def test_chat_starting_over_keeps_the_system_message(mixtral, monkeypatch):
    rendered = _recording_encode_chat(monkeypatch)
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


# --- chat: the context fills, Ctrl-C ---------------------------------------------------------

def _counting_generate(monkeypatch, interrupt_after: int | None = None) -> list[int]:
    """Engine.generate records each call's n; with `interrupt_after`, the first call sends this
    process a real SIGINT once that many tokens are out (as Ctrl-C in a terminal would)."""
    import signal

    calls: list[int] = []
    real = Engine.generate

    def generate(self, prompt, n=32, **kw):
        calls.append(n)
        for i, t in enumerate(real(self, prompt, n, **kw)):
            if interrupt_after is not None and len(calls) == 1 and i + 1 == interrupt_after:
                signal.raise_signal(signal.SIGINT)
            yield t

    monkeypatch.setattr(Engine, "generate", generate)
    return calls


@pytest.mark.parametrize("history, fresh, ctx, n, want", [
    (10, 10, 100, 20, (False, 20)),   # fits with the conversation
    (90, 10, 100, 20, (True, 20)),    # only a fresh start gives -n: starting over
    (10, 10, 100, 256, (False, 91)),  # -n fits nowhere: the room left, conversation kept
    (95, 10, 100, 256, (False, 6)),
    (120, 10, 100, 256, (True, 91)),  # the conversation no longer fits: a fresh start
    (100, 100, 100, 5, (False, 1)),   # a prompt that fills the context still gets one token
    (150, 101, 100, 5, None),         # this turn alone is longer than the context
])
def test_chat_turn_fit(history, fresh, ctx, n, want):
    from moepack.runtime.cli_chat import turn_fit

    assert turn_fit(history, fresh, ctx, n) == want


def test_chat_caps_replies_to_the_room_left_instead_of_ending(mixtral, monkeypatch):
    calls = _counting_generate(monkeypatch)
    r = _run("chat", mixtral, "--ctx", 24, input="w5 w6\nw7 w8\nw9\n\n")  # default -n 256
    assert r.exit_code == 0, r.output
    assert len(calls) == 3 and all(1 <= n <= 24 for n in calls), calls
    assert r.output.count("replies stop where the context") == 1, r.output  # said once
    assert "error" not in r.output, r.output
    r = _run("chat", mixtral, "-n", 2000, input="w5 w6\n\n")  # -n beyond the model's 128
    assert r.exit_code == 0 and len(calls) == 4 and calls[-1] <= 128, r.output


def test_chat_refuses_a_turn_that_can_never_fit_and_goes_on(mixtral, monkeypatch):
    rendered = _recording_encode_chat(monkeypatch)
    calls = _counting_generate(monkeypatch)
    long_line = " ".join(f"w{3 + i % 60}" for i in range(200))  # longer than ctx 128
    r = _run("chat", mixtral, "-n", 4, input=f"w5 w6\n{long_line}\nw7\n\n")
    assert r.exit_code == 0, r.output
    assert "not sent" in r.output and "starting over" not in r.output, r.output
    assert len(calls) == 2, calls  # the turns before and after it were answered
    w7 = next(m for m in rendered if m[-1]["content"] == "w7")
    assert w7[0]["content"] == "w5 w6", w7  # rendered with the conversation, which was kept


def test_chat_ctrl_c_stops_the_reply_and_the_chat_goes_on(mixtral, monkeypatch):
    calls = _counting_generate(monkeypatch, interrupt_after=2)
    r = _run("chat", mixtral, "-n", 8, input="w5 w6\nw7 w8\n\n")
    assert r.exit_code == 0, r.output
    assert len(calls) == 2 and "interrupted" in r.stderr, r.output


def test_chat_ctrl_c_in_a_turns_prompt_drops_that_line_and_goes_on(mixtral, monkeypatch):
    """The engine's cancel stops the turn's prompt (Cancelled, the sequence as before): the
    line was not sent, so the next turn is rendered without it."""
    import signal

    from moepack.runtime.engine import Cancelled

    rendered = _recording_encode_chat(monkeypatch)
    real, fed = Engine.feed, []

    def feed(self, tokens):
        fed.append(len(tokens))
        if len(fed) == 2:  # the second turn's prompt: Ctrl-C, and the engine stops it
            signal.raise_signal(signal.SIGINT)
            raise Cancelled("cancelled", -10)
        return real(self, tokens)

    monkeypatch.setattr(Engine, "feed", feed)
    r = _run("chat", mixtral, "-n", 1, input="w5 w6\nw7 w8\nw9\n\n")
    assert r.exit_code == 0, r.output
    assert "the message was not sent" in r.stderr, r.output
    w9 = next(m for m in rendered if m[-1]["content"] == "w9")
    assert [m["content"] for m in w9 if m["role"] == "user"] == ["w5 w6", "w9"], w9


def test_chat_ctrl_c_at_the_prompt_ends_it_with_130(mixtral, monkeypatch):
    def interrupted(prompt=""):
        raise KeyboardInterrupt

    monkeypatch.setattr("builtins.input", interrupted)
    r = _run("chat", mixtral)
    assert r.exit_code == 130 and "Traceback" not in r.output, r.output


# --- run: Ctrl-C, conflicting prompts, counts -----------------------------------------------

def test_run_ctrl_c_finishes_the_line_and_says_so(mixtral, monkeypatch):
    _counting_generate(monkeypatch, interrupt_after=3)
    r = _run("run", mixtral, "--tokens", "5,9", "-n", 20)
    assert r.exit_code == 130, r.output
    assert r.stdout.endswith("\n") and len(r.stdout.split()) == 3, r.stdout
    assert r.stderr.strip().splitlines() == ["interrupted after 3 tokens"], r.stderr
    _counting_generate(monkeypatch, interrupt_after=3)
    r = _run("run", mixtral, "--tokens", "5,9", "-n", 20, "--json")
    out = json.loads(r.stdout)
    assert r.exit_code == 130 and out["interrupted"] is True and len(out["tokens"]) == 3, out
    assert out["prompt_tokens"] == [5, 9] and "decode_tok_s" in out["stats"], out


def test_run_logit_bias_steers_sampling_and_bad_values_are_refused(mixtral):
    r = _run("run", mixtral, "--tokens", "5,9", "-n", 4, "--json", "--logit-bias", "40=100",
             "--logit-bias", "41=-100")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tokens"] == [40, 40, 40, 40]
    for bad, why in (("40", "not ID=BIAS"), ("40=101", "from -100 to 100"),
                     ("40=nan", "finite"), ("x=1", "not ID=BIAS")):
        r = _run("run", mixtral, "--tokens", "5,9", "--logit-bias", bad)
        assert r.exit_code == 2 and why in r.output, (bad, r.output)
    r = _run("run", mixtral, "--tokens", "5,9", "--logit-bias", "1=1", "--logit-bias", "1=2")
    assert r.exit_code == 2 and "given twice" in r.output, r.output
    r = _run("run", mixtral, "--tokens", "5,9", "--logit-bias", "9999=1", "--json")
    assert r.exit_code == 1 and "vocabulary" in json.loads(r.stdout)["error"]["message"]


def test_chat_takes_logit_bias(mixtral, monkeypatch):
    calls: list[dict] = []
    real = Engine.generate

    def generate(self, prompt, n=32, **kw):
        calls.append(kw.get("logit_bias"))
        return real(self, prompt, n, **kw)

    monkeypatch.setattr(Engine, "generate", generate)
    r = _run("chat", mixtral, "-n", 2, "--logit-bias", "40=5", input="w5\n\n")
    assert r.exit_code == 0 and calls == [{40: 5.0}], (calls, r.output)
    r = _run("chat", mixtral, "--logit-bias", "9999=1", input="w5\n\n")
    assert r.exit_code == 1 and "vocabulary" in r.output, r.output


def test_run_ctrl_c_while_the_engine_opens(mixtral, monkeypatch):
    """A Ctrl-C that stops the trunk read (Cancelled out of Engine(...)) is run's interrupted
    result with no tokens and no stats, exit 130."""
    from moepack.runtime.engine import Cancelled

    def cancelled(self, *a, **kw):
        raise Cancelled("cancelled while reading the trunk", -10)

    monkeypatch.setattr(Engine, "__init__", cancelled)
    monkeypatch.setattr(Engine, "__del__", lambda self: None)
    r = _run("run", mixtral, "--tokens", "5,9", "-n", 4, "--json")
    out = json.loads(r.stdout)
    assert r.exit_code == 130 and out["interrupted"] is True, r.output
    assert out["tokens"] == [] and out["stats"] is None
    assert r.stderr.strip().splitlines() == ["interrupted after 0 tokens"], r.stderr


def test_chat_sigterm_in_a_reply_ends_the_chat(mixtral, monkeypatch):
    """Ctrl-C stops one reply and the chat goes on; SIGTERM (SIGHUP alike) ends the chat: the
    process was asked to stop, not the reply (exit 130 here, 143 through moepack.cli)."""
    import signal

    calls: list[int] = []
    real = Engine.generate

    def generate(self, prompt, n=32, **kw):
        calls.append(n)
        for i, t in enumerate(real(self, prompt, n, **kw)):
            if i == 1:
                signal.raise_signal(signal.SIGTERM)
            yield t

    monkeypatch.setattr(Engine, "generate", generate)
    r = _run("chat", mixtral, "-n", 8, input="w5 w6\nw7 w8\n\n")
    assert r.exit_code == 130 and len(calls) == 1 and "interrupted" in r.stderr, r.output


def test_run_ctrl_c_while_the_prompt_is_read_never_opens_the_engine(mixtral, monkeypatch):
    import signal

    from moepack.runtime import cli_run

    real, opened = cli_run.prompt_ids, []

    def prompt_ids(*a, **kw):
        signal.raise_signal(signal.SIGINT)
        return real(*a, **kw)

    monkeypatch.setattr(cli_run, "prompt_ids", prompt_ids)
    monkeypatch.setattr(cli_run, "open_engine", lambda *a, **kw: opened.append(1))
    r = _run("run", mixtral, "--tokens", "5,9", "--json")
    assert r.exit_code == 130 and opened == [], r.output
    assert json.loads(r.stdout)["interrupted"] is True


def test_eval_writes_a_file_whose_name_is_as_long_as_allowed(mixtral, tmp_path):
    out = tmp_path / ("l" * 251 + ".npy")  # 255 bytes: NAME_MAX
    r = _run("eval", mixtral, "--tokens", "3,4", "--logits", out)
    assert r.exit_code == 0, r.output
    assert np.load(out).shape == (2, 67) and [p.name for p in tmp_path.iterdir()] == [out.name]


def test_run_refuses_prompt_text_and_tokens_together(mixtral):
    r = _run("run", mixtral, "w5", "--tokens", "1,2", "-n", 2)
    assert r.exit_code == 2, r.output
    assert "prompt text" in r.output and "--tokens" in r.output, r.output


@pytest.mark.parametrize("tokens", ["0,,1", "1,", ",1", "1, ,2"])
def test_tokens_with_an_empty_item_are_refused(mixtral, tokens, tmp_path):
    for args in (("run", mixtral, "--tokens", tokens),
                 ("eval", mixtral, "--tokens", tokens, "--logits", tmp_path / "l.npy")):
        r = _run(*args)
        assert r.exit_code == 2 and "empty item" in r.output, r.output
    assert not (tmp_path / "l.npy").exists()


def test_counts_of_one_read_in_the_singular(mixtral):
    r = _run("run", mixtral, "--tokens", "5", "-n", 200)
    assert r.exit_code == 1 and "the prompt's 1 token and" in r.output, r.output
    r = _run("plan", mixtral, "--budget", "1")
    assert r.exit_code == 1 and "budget 1 B is below" in r.output, r.output


# --- eval: --ctx is never raised behind the user's back --------------------------------------

def test_eval_refuses_a_ctx_shorter_than_the_tokens(mixtral, tmp_path):
    out = tmp_path / "l.npy"
    toks = ",".join(["5"] * 40)
    r = _run("eval", mixtral, "--tokens", toks, "--logits", out, "--ctx", 20)
    assert r.exit_code == 1 and "40 tokens" in r.output and "ctx is 20" in r.output, r.output
    assert not out.exists()
    r = _run("eval", mixtral, "--tokens", ",".join(["5"] * 129), "--logits", out)
    assert r.exit_code == 1 and "the 129 tokens" in r.output, r.output  # max 128
    assert "ctx 129" not in r.output and not out.exists(), r.output
    r = _run("eval", mixtral, "--tokens", toks, "--logits", out, "--ctx", 40)
    assert r.exit_code == 0 and np.load(out).shape == (40, 67), r.output


# --- plan and info: usage errors, JSON errors, one size rule ---------------------------------

def test_plan_usage_errors_exit_2(mixtral, tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{}")
    for args in (("plan", "--json"), ("plan", mixtral, "--config", config),
                 ("plan", mixtral, "--expert-codec", "rvq3-l")):
        r = _run(*args)
        assert r.exit_code == 2 and r.output.startswith("usage: "), (args, r.output)


def test_plan_and_info_json_errors_are_the_error_object(mixtral, tmp_path):
    keys = {"message", "engine_code", "code", "field", "offset", "max_ctx"}
    short = tmp_path / "short.moepack"
    short.write_bytes(mixtral.read_bytes()[:128])
    r = _run("plan", mixtral, "--ctx", 129, "--json")  # max_position_embeddings 128
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 1 and set(err) == keys, r.output
    assert (err["code"], err["max_ctx"]) == ("context_too_long", 128), err
    for cmd in ("plan", "info", "run"):
        args = ("--tokens", "1") if cmd == "run" else ()
        r = _run(cmd, tmp_path / "missing.moepack", *args, "--json")
        err = json.loads(r.stdout)["error"]
        assert r.exit_code == 1 and set(err) == keys and "missing" in err["message"], r.output
        r = _run(cmd, short, *args, "--json")
        err = json.loads(r.stdout)["error"]
        assert r.exit_code == 1 and err["code"] is not None, (cmd, r.output)


def test_plan_and_run_print_the_below_floor_sizes_alike(mixtral):
    """A budget a few hundred bytes below the floor: plan's refusal is run's (the engine's),
    six decimals where three would make the two amounts read the same."""
    floor = plan(str(mixtral), 64)["floor_bytes"]
    budget = floor // 1000 * 1000
    assert budget < floor
    p = _run("plan", mixtral, "--ctx", 64, "--budget", budget)
    r = _run("run", mixtral, "w5", "--ctx", 64, "--budget", budget)
    assert p.exit_code == r.exit_code == 1, (p.output, r.output)
    line = p.stderr.strip().removeprefix("error: ")
    assert r.stderr.strip().endswith(line), (line, r.stderr)
    assert format_size(floor, exact=True) in line and format_size(budget) in line, line


def test_plan_json_below_the_floor_is_runs_error_object_with_the_plan(mixtral):
    floor = plan(str(mixtral), 64)["floor_bytes"]
    p = _run("plan", mixtral, "--ctx", 64, "--budget", floor - 1000, "--json")
    r = _run("run", mixtral, "w5", "--ctx", 64, "--budget", floor - 1000, "--json")
    got, want = json.loads(p.stdout), json.loads(r.stdout)
    assert p.exit_code == r.exit_code == 1, (p.output, r.output)
    assert got["error"] == want["error"] and got["error"]["code"] == "budget_too_small"
    assert got["plan"]["budget_verdict"] == "below_floor" and got["plan"]["floor_bytes"] == floor


def test_cache_reports_never_exceed_the_experts(mixtral):
    """A budget far beyond every expert: the cache holds all of them and the rest is room to
    spare (longer prompts borrow it), not a cache bigger than the model's experts."""
    p = plan(str(mixtral), 64)
    budget = p["floor_bytes"] + 1000 * p["experts_bytes"]
    q = json.loads(_run("plan", mixtral, "--ctx", 64, "--budget", budget, "--json").stdout)
    assert q["budget_cache_bytes"] > q["experts_bytes"], q
    assert q["budget_cache_experts"] == q["default_cache_experts"] == q["expert_count"], q
    row = _run("plan", mixtral, "--ctx", 64, "--budget", budget).output.split("with --budget")[1]
    assert f"expert cache {format_size(p['experts_bytes'])}" in row, row
    assert "holds every expert" in row and "to spare" in row, row
    r = _run("run", mixtral, "--tokens", "5", "-n", 2, "--ctx", 64, "--budget", budget, "--json")
    s = json.loads(r.stdout)["stats"]
    assert s["cache_capacity_experts"] == p["expert_count"], s


# --- cosmetics ------------------------------------------------------------------------------

def test_eval_help_shows_the_logits_shape():
    r = _run("eval", "--help")
    assert "[n, vocab]" in " ".join(r.output.replace("│", " ").split()), r.output


def test_threads_beyond_the_usable_cores_warn(mixtral, monkeypatch):
    monkeypatch.setattr("moepack.sysinfo.usable_cores", lambda: 1)
    r = _run("run", mixtral, "--tokens", "5", "-n", 1, "--threads", 2)
    assert r.exit_code == 0 and "--threads 2 is more than the 1 usable core:" in r.stderr, r.output
    r = _run("run", mixtral, "--tokens", "5", "-n", 1, "--threads", 1)
    assert r.exit_code == 0 and "warning" not in r.stderr, r.output


def test_a_container_without_tokenizer_names_tokens(tmp_path):
    from moepack.format.synthetic import mixtral_spec, write_synthetic

    path = tmp_path / "synthetic.moepack"
    write_synthetic(path, mixtral_spec())
    r = _run("run", path, "w5")
    assert r.exit_code == 1 and "--tokens" in r.output, r.output
    r = _run("chat", path)
    assert r.exit_code == 1 and "chat needs one" in r.output, r.output


def test_run_text_leaves_special_tokens_out_as_streamed():
    """The demo samples its BOS (<s>) as the third token of this reply: run's --json text, like
    its streamed text and serve's replies, leaves it out (the token stays in `tokens`)."""
    from serve_fixtures import demo_container

    path = demo_container()
    tok = Tokenizer.from_container(str(path))
    prompt = tok.render_chat([{"role": "user", "content": "def read_config(path):"}])
    args = ("run", path, prompt, "-n", 10, "--temp", "1.0", "--seed", 7)
    out = json.loads(_run(*args, "--json").output)
    assert tok.bos_id in out["tokens"], out  # sampled: else this test checks nothing
    assert "<s>" not in out["text"] and out["text"]
    streamed = _run(*args).output
    assert streamed.startswith(out["text"]), (streamed, out["text"])
