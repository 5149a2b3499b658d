"""Constrained decoding for response_format json_object (and tool-call arguments): a
character-level JSON pushdown recognizer walked over a trie of the vocabulary's token texts
gives, for each recognizer state, the tokens that keep the output a valid JSON prefix.

States are small tuples (stack, mode, sub, whitespace run), so the mask of a state is computed
once and cached: inside a string every step has the same state."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

State = tuple
MAX_DEPTH = 32  # nesting limit: keeps the state space (and the output) bounded
MAX_WS = 16  # whitespace run limit: a model cannot pad forever between tokens
_WS = " \t\n\r"
_HEX = set("0123456789abcdefABCDEF")
_NUM = {  # number sub-state -> {char class: next sub-state}
    "-": {"0": "0", "d": "I"},
    "0": {".": ".", "e": "e"},
    "I": {"0": "I", "d": "I", ".": ".", "e": "e"},
    ".": {"0": "F", "d": "F"},
    "F": {"0": "F", "d": "F", "e": "e"},
    "e": {"+": "E", "0": "X", "d": "X"},
    "E": {"0": "X", "d": "X"},
    "X": {"0": "X", "d": "X"},
}
_NUM_END = {"0", "I", "F", "X"}
START: State = ("", "V", "top", 0)  # a JSON object and nothing else


def _num_class(c: str) -> str:
    if c == "0":
        return "0"
    if "1" <= c <= "9":
        return "d"
    if c in "eE":
        return "e"
    if c in "+-":
        return "+"
    return c if c == "." else "?"  # anything else: no class (a letter must not pass as "d")


def _close(stack: str) -> State:
    rest = stack[:-1]
    return (rest, "D", "", 0) if not rest else (rest, "A", "", 0)


def _start_value(stack: str, c: str) -> State | None:
    if c in "{[":
        if len(stack) >= MAX_DEPTH:
            return None
        return (stack + "o", "K", "", 0) if c == "{" else (stack + "a", "V", "[", 0)
    if c == '"':
        return (stack, "S", ("v", 0), 0)
    if c == "-":
        return (stack, "N", "-", 0)
    if c == "0":
        return (stack, "N", "0", 0)
    if "1" <= c <= "9":
        return (stack, "N", "I", 0)
    lit = {"t": "rue", "f": "alse", "n": "ull"}.get(c)
    return (stack, "L", lit, 0) if lit else None


def _after_value(stack: str, c: str) -> State | None:
    if c in _WS:
        return (stack, "A", "", 1)
    if c == ",":
        return (stack, "V", "", 0) if stack[-1] == "a" else (stack, "k", "", 0)
    if (c == "]" and stack[-1] == "a") or (c == "}" and stack[-1] == "o"):
        return _close(stack)
    return None


def step(st: State, c: str) -> State | None:
    """The state after character c, or None when c cannot continue valid JSON."""
    stack, mode, sub, ws = st
    if mode in "VKk:A" and c in _WS and sub != "top":  # the reply starts with "{" itself
        return (stack, mode, sub, ws + 1) if ws < MAX_WS else None
    if mode == "V":
        if sub == "top":
            return (stack + "o", "K", "", 0) if c == "{" else None
        if c == "]" and sub == "[":
            return _close(stack)
        return _start_value(stack, c)
    if mode == "K" or mode == "k":
        if c == "}" and mode == "K":
            return _close(stack)
        return (stack, "S", ("k", 0), 0) if c == '"' else None
    if mode == ":":
        return (stack, "V", "", 0) if c == ":" else None
    if mode == "A":
        return _after_value(stack, c)
    if mode == "S":
        kind, esc = sub
        if esc == 0:
            if c == '"':
                return (stack, ":", "", 0) if kind == "k" else (stack, "A", "", 0)
            if c == "\\":
                return (stack, "S", (kind, 1), 0)
            return st if ord(c) >= 0x20 else None
        if esc == 1:
            if c in '"\\/bfnrt':
                return (stack, "S", (kind, 0), 0)
            return (stack, "S", (kind, 2), 0) if c == "u" else None
        if c in _HEX:  # esc 2..5: the four hex digits of \uXXXX
            return (stack, "S", (kind, esc + 1 if esc < 5 else 0), 0)
        return None
    if mode == "N":
        nxt = _NUM[sub].get(_num_class(c))
        if nxt:
            return (stack, "N", nxt, 0)
        return _after_value(stack, c) if sub in _NUM_END else None
    if mode == "L":
        if c != sub[0]:
            return None
        return (stack, "L", sub[1:], 0) if len(sub) > 1 else (stack, "A", "", 0)
    return None  # "D": complete, nothing may follow


def walk(st: State | None, text: str) -> State | None:
    for c in text:
        if st is None:
            return None
        st = step(st, c)
    return st


def done(st: State) -> bool:
    return st[1] == "D"


class _Node:
    __slots__ = ("kids", "ids")

    def __init__(self) -> None:
        self.kids: dict[str, _Node] = {}
        self.ids: list[int] = []


class TokenTrie:
    """Token texts in a trie; `allowed(accept, state)` walks it with any step function."""

    def __init__(self, texts: list[str | None]) -> None:
        self.root = _Node()
        self.texts = texts
        for tid, text in enumerate(texts):
            if not text:
                continue
            node = self.root
            for c in text:
                node = node.kids.setdefault(c, _Node())
            node.ids.append(tid)

    def allowed(self, stepper, st) -> np.ndarray:
        """Ids of the tokens whose whole text the stepper accepts from state st."""
        out: list[int] = []
        todo = [(self.root, st)]
        while todo:
            node, s = todo.pop()
            for c, kid in node.kids.items():
                s2 = stepper(s, c)
                if s2 is not None:
                    out.extend(kid.ids)
                    todo.append((kid, s2))
        return np.asarray(sorted(out), dtype=np.int32)  # token ids are int32 (moepack.h)


class JsonMasker:
    """Allowed-token masks of the JSON recognizer, cached per state (LRU), at most `cache_size`
    masks and `cache_bytes` bytes: a mask inside a string holds nearly the whole vocabulary, so
    a count alone would let a 152k-token vocabulary's cache grow to hundreds of MB."""

    def __init__(self, trie: TokenTrie, cache_size: int = 512,
                 cache_bytes: int = 64 << 20) -> None:
        self.trie = trie
        self._cache: OrderedDict[State, np.ndarray] = OrderedDict()
        self._size, self._max_bytes, self.nbytes = cache_size, cache_bytes, 0

    def allowed(self, st: State) -> np.ndarray:
        hit = self._cache.get(st)
        if hit is not None:
            self._cache.move_to_end(st)
            return hit
        ids = self.trie.allowed(step, st)
        self._cache[st] = ids
        self.nbytes += ids.nbytes
        while len(self._cache) > 1 and (len(self._cache) > self._size
                                        or self.nbytes > self._max_bytes):
            self.nbytes -= self._cache.popitem(last=False)[1].nbytes
        return ids
