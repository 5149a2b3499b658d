"""What the server needs to know about the vocabulary: each token's text as it appears in
running text, which ids are special, and which end a turn."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property

from moepack.format.reader import Container
from moepack.runtime.tokenizer import Tokenizer
from moepack.serve.grammar import TokenTrie

from moepack.untrusted_json import loads

# end-of-turn tokens of the chat template families moepack's models use
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<|end_of_text|>",
                "<｜end▁of▁sentence｜>", "</s>")


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
        cfg = loads(raw, "generation_config.json", max_bytes=1 << 20)
    except ValueError:
        return []
    v = cfg.get("eos_token_id") if isinstance(cfg, dict) else None
    return [i for i in (v if isinstance(v, list) else [v])
            if isinstance(i, int) and not isinstance(i, bool)]


class Vocab:
    def __init__(self, tok: Tokenizer, vocab_size: int, eos_ids: Iterable[int] = ()) -> None:
        self.tok = tok
        self.size = vocab_size
        self.special_ids = tok.special_ids
        stops = {tok.eos_id, *eos_ids, *(tok.token_id(t) for t in _END_OF_TURN)}
        self.stop_ids = {i for i in stops if i is not None and 0 <= i < vocab_size}

    @cached_property
    def texts(self) -> list[str | None]:
        """Text of each token after some other text (decoding a lone token drops a leading
        space in SentencePiece vocabularies, so each is decoded behind a fixed one and that
        one's text cut off). None: special, or not whole UTF-8 on its own."""
        base = self.tok.encode("a", add_special_tokens=False)[-1:]
        head = self.tok.decode(base)
        pairs = self.tok._tok.decode_batch([base + [i] for i in range(self.size)],
                                           skip_special_tokens=False)
        out: list[str | None] = []
        for i, text in enumerate(pairs):
            piece = text[len(head):] if text.startswith(head) else None
            ok = piece and "\ufffd" not in piece and i not in self.special_ids
            out.append(piece if ok else None)
        return out

    @cached_property
    def trie(self) -> TokenTrie:
        return TokenTrie(self.texts)

    def piece(self, tid: int) -> str:
        """A token's text for logprobs (may be a partial character: then its bytes say more)."""
        t = self.texts[tid] if 0 <= tid < self.size else None
        return t if t is not None else self.tok.decode([tid])
