"""OpenAI response objects and stream chunks, built from the worker's events."""

from __future__ import annotations

import json
import time
import uuid

from moepack.runtime.cli import stats_line
from moepack.serve import tools
from moepack.serve.job import Done, Piece, TokenLogprob

FINGERPRINT = "fp_moepack"


def _split(chunk: dict) -> tuple[bytes, bytes]:
    """A chunk's JSON cut around its text placeholder "\\u0000" (which no text contains
    unescaped: json.dumps writes a NUL as \\u0000 too, but the placeholder is the only one in
    a chunk built around it)."""
    raw = json.dumps(chunk, ensure_ascii=False).encode()
    head, tail = raw.split(b'"\\u0000"')
    return head, tail


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(d: Done) -> dict:
    return {"prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens,
            "total_tokens": d.prompt_tokens + d.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": d.cached_tokens}}


def extra_stats(d: Done) -> dict:
    """moepack's own per-request figures (an extension field; clients ignore it)."""
    return {"line": stats_line(d.stats), "prompt_tokens_evaluated": d.stats["prompt_tokens"],
            "seconds": round(d.seconds, 4),
            "time_to_first_token": None if d.first_token_seconds is None
            else round(d.first_token_seconds, 4),
            "decode_tok_s": round(d.stats["decode_tok_s"], 3),
            "cache_hit_rate": round(d.stats["hit_rate"], 4),
            "bytes_read": d.stats["bytes_read"]}


def chat_logprob(lp: TokenLogprob) -> dict:
    return {"token": lp.token, "logprob": lp.logprob, "bytes": list(lp.token.encode()),
            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())}
                             for t, v in lp.top]}


class ChatOutput:
    """Splits generated text into content and tool calls, for streams and whole replies."""

    def __init__(self, fam: str | None, names: list[str], forced: bool) -> None:
        self.fam, self.names, self.forced = fam, set(names), forced
        self.split = tools.MarkerSplit(tools.start_marker(fam)) if fam and names else None
        self.text = ""

    def content_delta(self, text: str) -> str:
        self.text += text
        if self.forced:
            return ""
        return self.split.push(text) if self.split else text

    def finish(self, done: Done) -> tuple[str | None, list[tools.Call], str, str]:
        """(content, calls, content not yet streamed, finish_reason)."""
        if self.fam and self.names:
            content, calls = tools.parse(self.fam, self.text, self.names)
            if calls:
                return (content or None), calls, "", "tool_calls"
        rest = self.split.rest() if self.split else ""
        if self.forced:
            rest = self.text
        return self.text, [], rest, done.finish_reason


class ChatResponder:
    def __init__(self, model: str, out: ChatOutput, logprobs: bool) -> None:
        self.id, self.created, self.model = new_id("chatcmpl"), int(time.time()), model
        self.out, self.logprobs = out, logprobs
        self.entries: list[dict] = []
        self._head: bytes | None = None
        self._tail = b""

    def _chunk(self, delta: dict, finish: str | None = None, lps: list | None = None) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "delta": delta,
                             "logprobs": {"content": lps} if lps is not None else None,
                             "finish_reason": finish}]}

    def first_chunk(self) -> dict:
        return self._chunk({"role": "assistant", "content": ""})

    def piece_chunk(self, pieces: list[Piece]) -> dict | bytes | None:
        text = self.out.content_delta("".join(p.text for p in pieces))
        lps = [chat_logprob(p.logprob) for p in pieces if p.logprob] if self.logprobs else []
        self.entries.extend(lps)
        if not text and not lps:
            return None
        if not lps:  # the common chunk, serialized around the text alone (per-token cost)
            if self._head is None:
                self._head, self._tail = _split(self._chunk({"content": "\0"}))
            return self._head + json.dumps(text, ensure_ascii=False).encode() + self._tail
        return self._chunk({"content": text} if text else {}, lps=lps)

    def final_chunks(self, d: Done, include_usage: bool) -> list[dict]:
        _, calls, rest, finish = self.out.finish(d)
        chunks = []
        if rest:
            chunks.append(self._chunk({"content": rest}))
        if calls:
            chunks.append(self._chunk({"tool_calls": [c.as_openai(i)
                                                       for i, c in enumerate(calls)]}))
        last = self._chunk({}, finish)
        last["moepack_stats"] = extra_stats(d)
        chunks.append(last)
        if include_usage:
            chunks.append({"id": self.id, "object": "chat.completion.chunk",
                           "created": self.created, "model": self.model,
                           "system_fingerprint": FINGERPRINT, "choices": [], "usage": usage(d)})
        return chunks

    def whole(self, pieces: list[Piece], d: Done) -> dict:
        self.piece_chunk(pieces)
        content, calls, _, finish = self.out.finish(d)
        msg: dict = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            msg["tool_calls"] = [c.as_openai() for c in calls]
        return {"id": self.id, "object": "chat.completion", "created": self.created,
                "model": self.model, "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "message": msg,
                             "logprobs": {"content": self.entries} if self.logprobs else None,
                             "finish_reason": finish}],
                "usage": usage(d), "moepack_stats": extra_stats(d)}


class CompletionResponder:
    def __init__(self, model: str, logprobs: bool) -> None:
        self.id, self.created, self.model = new_id("cmpl"), int(time.time()), model
        self.logprobs = logprobs
        self.offset = 0
        self._head: bytes | None = None
        self._tail = b""
        self.lp = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def _add(self, p: Piece) -> dict | None:
        if not (self.logprobs and p.logprob):
            self.offset += len(p.text)
            return None
        one = {"tokens": [p.logprob.token], "token_logprobs": [p.logprob.logprob],
               "top_logprobs": [dict(p.logprob.top)], "text_offset": [self.offset]}
        for k, v in one.items():
            self.lp[k].extend(v)
        self.offset += len(p.text)
        return one

    def _chunk(self, text: str, finish: str | None, lp: dict | None) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "system_fingerprint": FINGERPRINT,
                "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}

    def piece_chunk(self, pieces: list[Piece]) -> dict | bytes | None:
        lps = [lp for lp in (self._add(p) for p in pieces) if lp]
        text = "".join(p.text for p in pieces)
        if text and not lps:  # the common chunk, serialized around the text alone
            if self._head is None:
                self._head, self._tail = _split(self._chunk("\0", None, None))
            return self._head + json.dumps(text, ensure_ascii=False).encode() + self._tail
        lp = {k: [x for one in lps for x in one[k]] for k in self.lp} if lps else None
        return self._chunk(text, None, lp) if text or lp else None

    def final_chunks(self, d: Done, include_usage: bool) -> list[dict]:
        last = self._chunk("", d.finish_reason, None)
        last["moepack_stats"] = extra_stats(d)
        out = [last]
        if include_usage:
            out.append({"id": self.id, "object": "text_completion", "created": self.created,
                        "model": self.model, "system_fingerprint": FINGERPRINT,
                        "choices": [], "usage": usage(d)})
        return out

    def whole(self, pieces: list[Piece], d: Done) -> dict:
        for p in pieces:
            self._add(p)
        body = self._chunk(d.text, d.finish_reason, self.lp if self.logprobs else None)
        return {**body, "usage": usage(d), "moepack_stats": extra_stats(d)}
