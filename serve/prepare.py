"""Turns a validated request into a Job: prompt tokens, sampling, limits and constraints.
Everything here raises ApiError (400) for what the client got wrong."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from moepack.runtime.engine import LogitAdjust
from moepack.runtime.tokenizer import Tokenizer
from moepack.serve import tools
from moepack.serve.constraint import Chain, Choice, Constraint, Forced, JsonObject
from moepack.serve.errors import ApiError
from moepack.serve.grammar import JsonMasker
from moepack.serve.job import Job
from moepack.serve.schemas import ChatRequest, CompletionRequest, _Sampling
from moepack.serve.vocab import Vocab


@dataclass
class ToolMode:
    family: str | None = None
    names: tuple[str, ...] = ()
    forced: bool = False


class Preparer:
    def __init__(self, tok: Tokenizer, vocab: Vocab, ctx: int) -> None:
        self.tok, self.vocab, self.ctx = tok, vocab, ctx
        self.tool_family = tools.family(tok.chat_template)
        # a text longer than this cannot fit in ctx tokens; 4x for normalizers that compose
        # several characters into one (NFC, Hangul jamo: 3 into 1)
        self.max_chars = 4 * ctx * vocab.longest_token

    def _encode_fitting(self, text: str, param: str,
                        encode: Callable[[str], list[int]]) -> list[int]:
        """encode(text), refused first when the text cannot fit: tokenizing 4 MB takes
        seconds of a thread (serve/offload.py) and ~200x its size in memory."""
        if len(text) > self.max_chars:
            raise ApiError(400, f"This model's maximum context length is {self.ctx} tokens; "
                           f"your prompt has {len(text)} characters, more than that many "
                           "tokens can hold", param=param, code="context_length_exceeded")
        return encode(text)

    @cached_property
    def masker(self) -> JsonMasker:
        return JsonMasker(self.vocab.trie)

    def _job(self, req: _Sampling, prompt: list[int], max_tokens: int | None,
             param: str) -> Job:
        if req.n not in (None, 1):
            raise ApiError(400, "n > 1 is not supported: this server runs one sequence at a "
                           "time", param="n", code="unsupported_value")
        if len(prompt) >= self.ctx:
            raise ApiError(400, f"This model's maximum context length is {self.ctx} tokens; "
                           f"your prompt has {len(prompt)} tokens", param=param,
                           code="context_length_exceeded")
        room = self.ctx - len(prompt)
        return Job(prompt=prompt, max_tokens=min(max_tokens or room, room),
                   temperature=1.0 if req.temperature is None else req.temperature,
                   top_p=1.0 if req.top_p is None else req.top_p,
                   seed=secrets.randbits(63) if req.seed is None else req.seed,
                   stops=req.stops(), adjust=self._adjust(req))

    def _adjust(self, req: _Sampling) -> LogitAdjust | None:
        if not (req.logit_bias or req.presence_penalty or req.frequency_penalty):
            return None
        bias = {int(k): v for k, v in (req.logit_bias or {}).items()}  # keys checked: digits
        try:  # the schema checked the rest; what is left is an id outside the vocabulary
            return LogitAdjust(self.vocab.size, bias, req.presence_penalty or 0.0,
                               req.frequency_penalty or 0.0)
        except ValueError as e:
            raise ApiError(400, str(e), param="logit_bias", code="invalid_value") from None

    def completion(self, req: CompletionRequest) -> Job:
        if req.echo:
            raise ApiError(400, "echo is not supported", param="echo", code="unsupported_value")
        if req.suffix:
            raise ApiError(400, "suffix is not supported", param="suffix",
                           code="unsupported_value")
        p = req.prompt
        if isinstance(p, list) and not isinstance(p[0], int):  # a list of prompts
            if len(p) > 1:
                raise ApiError(400, f"prompt is a list of {len(p)} prompts: batched prompts "
                               "are not supported (one sequence at a time); send one prompt "
                               "per request", param="prompt", code="unsupported_value")
            p = p[0]
        if isinstance(p, list):
            if any(t < 0 or t >= self.vocab.size for t in p):
                raise ApiError(400, f"prompt token ids must be in 0..{self.vocab.size - 1}",
                               param="prompt", code="invalid_value")
            ids = list(p)
        else:
            ids = self._encode_fitting(p, "prompt", self.tok.encode_prompt)
        if not ids:
            raise ApiError(400, "prompt is empty", param="prompt", code="invalid_value")
        job = self._job(req, ids, req.max_tokens, "prompt")
        job.top_logprobs = req.logprobs
        return job

    def chat(self, req: ChatRequest) -> tuple[Job, ToolMode]:
        mode, tool_defs = self._tools(req)
        messages = []
        for m in req.messages:
            d: dict = {"role": "system" if m.role == "developer" else m.role,
                       "content": m.text()}
            if m.name:
                d["name"] = m.name
            if m.tool_calls:
                d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
            if m.tool_call_id:
                d["tool_call_id"] = m.tool_call_id
            messages.append(d)
        try:
            text = self.tok.render_chat(tools.template_messages(messages), tools=tool_defs)
        except Exception as e:  # noqa: BLE001 (jinja raises many kinds; all are the input's)
            raise ApiError(400, f"the chat template refused these messages: {e}",
                           param="messages", code="invalid_value") from None
        ids = self._encode_fitting(text, "messages", self._encode)  # the template writes BOS
        job = self._job(req, ids, req.max_completion_tokens or req.max_tokens, "messages")
        job.prompt_text = text
        if req.logprobs:
            job.top_logprobs = req.top_logprobs or 0
        elif req.top_logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs",
                           code="invalid_value")
        job.constraint = self._constraint(req, mode)
        if mode.family:
            job.show_special = frozenset(
                i for i in map(self.tok.token_id, tools.syntax(mode.family)) if i is not None)
        return job, mode

    def _tools(self, req: ChatRequest) -> tuple[ToolMode, list[dict] | None]:
        choice = req.tool_choice
        if not req.tools:
            if choice not in (None, "none", "auto"):
                raise ApiError(400, "tool_choice needs tools", param="tool_choice",
                               code="invalid_value")
            return ToolMode(), None
        if self.tool_family is None:
            if choice == "none":  # the model is not to call them: nothing to render
                return ToolMode(), None
            raise ApiError(400, "this model's chat template does not take tools (supported: "
                           "Hermes/Qwen <tool_call>, DeepSeek, Kimi K2 and Mistral [TOOL_CALLS] "
                           "templates)", param="tools", code="unsupported_value")
        defs = [t.model_dump(exclude_none=True) for t in req.tools]
        names = [t.function.name for t in req.tools]
        if choice == "none":
            return ToolMode(), defs
        if choice is None or choice == "auto":
            return ToolMode(self.tool_family, tuple(names)), defs
        if choice == "required":
            return ToolMode(self.tool_family, tuple(names), True), defs
        if choice.function.name not in names:
            raise ApiError(400, f"tool_choice names {choice.function.name!r}, which is not in "
                           "tools", param="tool_choice", code="invalid_value")
        return ToolMode(self.tool_family, (choice.function.name,), True), defs

    def _constraint(self, req: ChatRequest, mode: ToolMode) -> Constraint | None:
        fmt = req.response_format.type if req.response_format else "text"
        if fmt == "json_schema":
            raise ApiError(400, "response_format json_schema is not supported; use json_object",
                           param="response_format", code="unsupported_value")
        if mode.forced:
            if fmt == "json_object":
                raise ApiError(400, "response_format json_object cannot be combined with a "
                               "forced tool_choice", param="response_format")
            before, options, mid, after = tools.forced_parts(mode.family, list(mode.names))
            enc = self._encode
            return Chain([Forced(enc(before)), Choice(self.vocab.trie, options),
                          Forced(enc(mid)), JsonObject(self.masker), Forced(enc(after))])
        if fmt == "json_object":
            return JsonObject(self.masker)
        return None

    def _encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)
