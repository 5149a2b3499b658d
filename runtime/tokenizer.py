"""Tokenizer and chat template from a container's blobs (`tokenizer.json`,
`tokenizer_config.json`), via the `tokenizers` library and jinja2 (as transformers renders
chat templates: sandboxed, trim_blocks + lstrip_blocks)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from functools import cached_property

from moepack.format.reader import Container

from moepack.cliargs import utf8_problem
from moepack.untrusted_json import loads

MAX_CONFIG_BYTES = 64 << 20   # chat templates included, real configs are well under 1 MB
MAX_GENERATION_CONFIG_BYTES = 1 << 20  # a few ids and sampling defaults


# end-of-turn tokens of the chat template families moepack's models use
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<|end_of_text|>",
                "<｜end▁of▁sentence｜>", "</s>")


class TokenizerError(RuntimeError):
    """The container's tokenizer or chat template cannot be read or used."""


def _token_text(v: object) -> str | None:
    if isinstance(v, dict):  # {"content": "<s>", ...}
        v = v.get("content")
    return v if isinstance(v, str) else None  # the config is untrusted: text or nothing


def _parse_config(raw: bytes, path: str) -> dict:
    """tokenizer_config.json from a container (untrusted): a JSON object, or TokenizerError."""
    cfg = loads(raw, f"{path}: tokenizer_config.json", max_bytes=MAX_CONFIG_BYTES,
                error=TokenizerError)
    if not isinstance(cfg, dict):
        raise TokenizerError(f"{path}: tokenizer_config.json is not a JSON object")
    return cfg


class Tokenizer:
    def __init__(self, tokenizer_json: bytes, config: dict | None = None) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        try:
            self._tok = HfTokenizer.from_str(tokenizer_json.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 (tokenizers raises plain Exception)
            raise TokenizerError(f"tokenizer.json: {e}") from None
        self.config = config or {}
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.chat_template = self.config.get("chat_template")
        if isinstance(self.chat_template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in self.chat_template
                     if isinstance(t, dict) and isinstance(t.get("name"), str)}
            self.chat_template = named.get("default") or next(iter(named.values()), None)

    @classmethod
    def from_container(cls, path: str) -> Tokenizer:
        """The container's tokenizer. A malformed container raises the reader's FormatError
        unchanged (its stable code, field and offset are what a caller reports)."""
        with Container.open(path) as c:
            names = {s["name"] for s in c.sections if s["type"] == "blob"}
            if "tokenizer.json" not in names:
                raise TokenizerError(f"{path} has no tokenizer.json blob; "
                                     "pass token ids instead")
            raw_cfg = (c.blob("tokenizer_config.json")
                       if "tokenizer_config.json" in names else b"{}")
            tokenizer_json = bytes(c.blob("tokenizer.json"))
        return cls(tokenizer_json, _parse_config(raw_cfg, path))

    def token_id(self, text: str | None) -> int | None:
        return None if text is None else self._tok.token_to_id(text)

    @property
    def eos_id(self) -> int | None:
        return self.token_id(self.eos_token)

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked special (BOS, EOS, turn and control markers), the
        ones transformers' `skip_special_tokens` leaves out of decoded text."""
        return frozenset(i for i, t in self._tok.get_added_tokens_decoder().items()
                         if t.special)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        problem = utf8_problem(text)  # lone surrogates: `tokenizers` raises a bare TypeError
        if problem:
            raise TokenizerError(f"the text {problem}; text is read as UTF-8 only")
        # encode_batch lets go of the GIL while it works, encode holds it: a 4 MB text held
        # every other thread (the server's event loop) for seconds
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    @property
    def bos_id(self) -> int | None:
        return self.token_id(self.bos_token)

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt as the model saw documents in training: the tokenizer's own special tokens,
        plus the BOS token in front when the tokenizer has one and did not add it (some
        tokenizer.json post-processors add no BOS; `add_bos_token: false` turns this off)."""
        ids = self.encode(text)
        bos = self.bos_id
        if self.config.get("add_bos_token", True) and bos is not None and ids[:1] != [bos]:
            ids = [bos, *ids]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        # decode_batch lets go of the GIL, decode holds it (as encode_batch and encode)
        return self._tok.decode_batch([list(ids)], skip_special_tokens=skip_special_tokens)[0]

    def render_chat(self, messages: list[dict], *, add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> str:
        if not self.chat_template:
            raise TokenizerError("the container's tokenizer_config.json has no chat_template")
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise TemplateError(msg)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent,
                                                                        ensure_ascii=False)
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt, tools=tools,
                bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except TemplateError as e:
            raise TokenizerError(f"chat template: {e}") from None
        except Exception as e:  # noqa: BLE001 (the template is the container's code: 1 + "a",
            # a recursive macro or a bad chat_template type fail here, not in moepack)
            raise TokenizerError(f"chat template: {type(e).__name__}: {e}") from None

    def encode_chat(self, messages: list[dict], *, add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:
        # the template writes special tokens (bos) itself
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        return self.encode(text, add_special_tokens=False)


def generation_eos_ids(path: str) -> list[int]:
    """generation_config.json's eos_token_id, one id or a list (GLM-4.5 ends a turn with
    <|user|> or <|observation|> as well as <|endoftext|>): transformers' generate stops at
    each. [] when the container has none, or one that is not JSON (it is optional)."""
    with Container.open(path) as c:
        if not any(s["type"] == "blob" and s["name"] == "generation_config.json"
                   for s in c.sections):
            return []
        raw = bytes(c.blob("generation_config.json"))
    try:
        cfg = loads(raw, "generation_config.json", max_bytes=MAX_GENERATION_CONFIG_BYTES)
    except ValueError:
        return []
    v = cfg.get("eos_token_id") if isinstance(cfg, dict) else None
    return [i for i in (v if isinstance(v, list) else [v])
            if isinstance(i, int) and not isinstance(i, bool)]


def stop_ids(tok: Tokenizer, vocab_size: int, eos_ids: Collection[int] = ()) -> set[int]:
    """The ids that end a reply: the tokenizer's EOS, generation_config.json's `eos_ids` and
    the end-of-turn markers of the known chat template families (as llama.cpp stops at every
    end-of-generation token), those inside the vocabulary."""
    stops = {tok.eos_id, *eos_ids, *(tok.token_id(t) for t in _END_OF_TURN)}
    return {i for i in stops if i is not None and 0 <= i < vocab_size}


class StreamDecoder:
    """Turns a token stream into text pieces. Each new token is decoded with the tokens since
    the last piece's start, so that multi-byte characters and merged spaces come out right at
    a cost that does not grow with the reply (re-decoding the whole reply took 0.46 ms a token
    after 4000 tokens of the demo, a third of its decode time). Tokens in `skip` (default:
    the special ones) give no text, as transformers' `skip_special_tokens` and llama.cpp's
    output leave them out: a BOS or a control token sampled mid-reply is no part of the
    reply's text."""

    def __init__(self, tok: Tokenizer, skip: Collection[int] | None = None) -> None:
        self.tok, self.ids = tok, []
        self.start = 0  # the window decoded with each token: ids[start:]
        self.given = 0  # ids[start:given] are the window's tokens already given as text
        self.skip = tok.special_ids if skip is None else skip

    def push(self, tid: int) -> str:
        if tid in self.skip:
            return ""
        self.ids.append(tid)
        before = self.tok.decode(self.ids[self.start:self.given])
        now = self.tok.decode(self.ids[self.start:])
        # an incomplete UTF-8 sequence, or a token with no text yet: wait for more tokens
        if now.endswith("\ufffd") or len(now) <= len(before):
            return ""
        self.start, self.given = self.given, len(self.ids)
        return now[len(before):]
