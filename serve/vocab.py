"""What the server needs to know about the vocabulary: each token's text as it appears in
running text, which ids are special, and which end a turn."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property

from moepack.runtime.tokenizer import Tokenizer, stop_ids
from moepack.serve.grammar import TokenTrie


class Vocab:
    def __init__(self, tok: Tokenizer, vocab_size: int, eos_ids: Iterable[int] = ()) -> None:
        self.tok = tok
        self.size = vocab_size
        self.special_ids = tok.special_ids
        self.stop_ids = stop_ids(tok, vocab_size, eos_ids)

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
    def longest_token(self) -> int:
        """Characters in the longest token as the vocabulary writes it: no token covers more
        of a text (a byte-level token's characters are its bytes, a byte-fallback token is
        written <0xAB>)."""
        return max(map(len, self.tok._tok.get_vocab(with_added_tokens=True)), default=1)

    @cached_property
    def trie(self) -> TokenTrie:
        return TokenTrie(self.texts)

    def piece(self, tid: int) -> str:
        """A token's text for logprobs (may be a partial character: then its bytes say more)."""
        t = self.texts[tid] if 0 <= tid < self.size else None
        return t if t is not None else self.tok.decode([tid])
