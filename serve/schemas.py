"""Request bodies of the OpenAI API as pydantic models: strict types (a string where a number
belongs is a 400, as the API does), unknown fields ignored (clients send many)."""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Strict):
    type: str
    text: str

    @field_validator("type")
    @classmethod
    def _text_only(cls, v: str) -> str:
        if v != "text":  # image_url, input_audio, file: this server reads text only
            raise PydanticCustomError(
                UNSUPPORTED_PART, "only text content parts are supported, not {kind}",
                {"kind": v})
        return v


class FunctionCall(_Strict):
    name: str
    arguments: str = "{}"


class ToolCall(_Strict):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class FunctionDef(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str | None = None
    parameters: dict | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]


class StreamOptions(_Strict):
    include_usage: bool = False


Stop = str | Annotated[list[str], Field(max_length=4)] | None
Temperature = Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)]
TopP = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]
MAX_LOGIT_BIAS = 300  # entries, as OpenAI allows
# no leading zeros, so no two keys name one token; 10 digits at most (int() of a huge one
# is slow)
_TOKEN_KEY = re.compile(r"0|[1-9][0-9]{0,9}")

# What these fields take, said whole: pydantic names one failed bound or union member at a
# time (a NaN temperature "should be less than or equal to 2", five stop strings "should be a
# valid string").
FIELD_RULES = {
    "temperature": "a finite number from 0 to 2",
    "top_p": "a finite number above 0 and at most 1",
    "presence_penalty": "a finite number from -2 to 2",
    "frequency_penalty": "a finite number from -2 to 2",
    "stop": "a string or a list of at most 4 strings",
    "logit_bias": f"an object of at most {MAX_LOGIT_BIAS} token ids (decimal strings) mapped to "
                  "finite numbers from -100 to 100",
    "prompt": "a string or a non-empty list of token ids (integers)",
}
UNSUPPORTED_PART = "unsupported_content_part"  # an error type of our own, reported as it is


class _Sampling(_Strict):
    model: str = ""
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: int | None = None
    stop: Stop = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # token ids as JSON keys: checked against the vocabulary by the Preparer
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _bias_entries(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        # the ids against the vocabulary come later (Preparer); errors say FIELD_RULES' rule
        if v is not None and (len(v) > MAX_LOGIT_BIAS or not all(
                _TOKEN_KEY.fullmatch(k) and math.isfinite(b) and -100 <= b <= 100
                for k, b in v.items())):
            raise ValueError("bad logit_bias")
        return v

    def stops(self) -> list[str]:
        s = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [x for x in s if x]


class ChatRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(_Sampling):
    # a list of prompts validates, so that the refusal can say batches are not supported
    prompt: str | Annotated[list[int], Field(min_length=1)] | \
        Annotated[list[str | Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool | None = False
    suffix: str | None = None
