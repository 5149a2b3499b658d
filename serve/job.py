"""A request as the worker sees it, and what it sends back."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from moepack.runtime.engine import LogitAdjust
from moepack.serve.channel import Channel
from moepack.serve.constraint import Constraint


class ServerStopping(Exception):
    """Sent to the requests that run or wait when the server stops (SIGINT, SIGTERM)."""

    def __init__(self) -> None:
        super().__init__("the server is shutting down; this request was stopped before it "
                         "finished")


class CancelEvent(threading.Event):
    """Set when the request's client leaves or the server stops. `hook` (the worker sets it to
    Engine.cancel while the request runs) stops the engine call under way too: a long prompt
    stops within a layer's work instead of running to its end."""

    def __init__(self) -> None:
        super().__init__()
        self.hook: Callable[[], object] | None = None

    def set(self) -> None:
        super().set()
        hook = self.hook
        if hook is not None:
            hook()


@dataclass
class TokenLogprob:
    token: str
    logprob: float
    top: list[tuple[str, float]]


@dataclass
class Piece:
    """One generated token: the text it lets out (may be "" while a stop string or a split
    character is pending) and, when asked for, its log-probability."""
    text: str
    token_id: int
    logprob: TokenLogprob | None = None


@dataclass
class Done:
    finish_reason: str  # stop | length | cancelled
    prompt_tokens: int  # in the KV cache for this request (fewer when cancelled in its prompt)
    cached_tokens: int  # prompt tokens whose KV came from the previous request
    completion_tokens: int
    text: str  # everything let out
    stats: dict  # this request's engine stats (same keys as Engine.stats())
    seconds: float
    first_token_seconds: float | None


@dataclass
class Job:
    prompt: list[int]
    max_tokens: int
    prompt_text: str | None = None  # chat: the rendered conversation (for prefix reuse)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    stops: list[str] = field(default_factory=list)
    top_logprobs: int | None = None  # None: no logprobs; 0: the chosen token's only
    constraint: Constraint | None = None
    adjust: LogitAdjust | None = None  # logit_bias and penalties (None: none asked for)
    show_special: frozenset[int] = frozenset()  # special tokens kept in the text (tool syntax)
    cancel: CancelEvent = field(default_factory=CancelEvent)
    events: Channel = field(default_factory=Channel)

    def emit(self, ev: Piece | Done | BaseException) -> None:
        """From the worker thread: hand an event to the request's event loop."""
        self.events.put(ev)
