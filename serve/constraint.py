"""Constraints on what the model may generate: forced text, a choice among strings, a JSON
object; chained. The generation loop asks each step for a forced token or an allowed set."""

from __future__ import annotations

import numpy as np
from moepack.serve import grammar
from moepack.serve.grammar import JsonMasker, TokenTrie


class Constraint:
    done = False

    def forced(self) -> int | None:
        return None

    def allowed(self) -> np.ndarray | None:
        return None

    def advance(self, tid: int) -> None:
        pass


class Forced(Constraint):
    """Exactly these token ids, one per step."""

    def __init__(self, ids: list[int]) -> None:
        self.ids, self.i = ids, 0
        self.done = not ids

    def forced(self) -> int | None:
        return self.ids[self.i]

    def advance(self, tid: int) -> None:
        self.i += 1
        self.done = self.i >= len(self.ids)


class Choice(Constraint):
    """One of the given strings (none may be a prefix of another)."""

    def __init__(self, trie: TokenTrie, options: list[str]) -> None:
        self.trie, self.options, self.text = trie, set(options), ""
        self._prefixes = {o[:n] for o in options for n in range(1, len(o) + 1)}

    def _step(self, s: str, c: str) -> str | None:
        return s + c if s + c in self._prefixes else None

    def allowed(self) -> np.ndarray | None:
        return self.trie.allowed(self._step, self.text)

    def advance(self, tid: int) -> None:
        self.text += self.trie.texts[tid] or ""
        self.done = self.text in self.options


class JsonObject(Constraint):
    """One JSON object (token-level mask from the JSON recognizer)."""

    def __init__(self, masker: JsonMasker) -> None:
        self.masker, self.state = masker, grammar.START

    def allowed(self) -> np.ndarray | None:
        return self.masker.allowed(self.state)

    def advance(self, tid: int) -> None:
        st = grammar.walk(self.state, self.masker.trie.texts[tid] or "")
        if st is None:  # cannot happen for a token from allowed(); end rather than go wrong
            self.done = True
            return
        self.state = st
        self.done = grammar.done(st)


class Chain(Constraint):
    def __init__(self, parts: list[Constraint]) -> None:
        self.parts = [p for p in parts if not p.done]
        self.done = not self.parts

    def forced(self) -> int | None:
        return self.parts[0].forced()

    def allowed(self) -> np.ndarray | None:
        return self.parts[0].allowed()

    def advance(self, tid: int) -> None:
        self.parts[0].advance(tid)
        if self.parts[0].done:
            self.parts.pop(0)
        self.done = not self.parts
