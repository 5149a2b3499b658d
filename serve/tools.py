"""Tool calls: which template family a container's chat template is, how a forced call is
written in it, and how calls are parsed back out of generated text.

Supported families (those of the models moepack converts):
  hermes   - Qwen2.5/Qwen3(-MoE), Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
  deepseek - DeepSeek V2.5/V3: <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}
             \\n```<｜tool▁call▁end｜> (the V3.1 form NAME<｜tool▁sep｜>{...} is parsed too)
A template that mentions neither cannot take tools: such requests get a 400."""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

HERMES, DEEPSEEK = "hermes", "deepseek"
_DS_CALLS_BEGIN, _DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_BEGIN, _DS_SEP, _DS_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
_HERMES_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_DS_RE = re.compile(re.escape(_DS_BEGIN) + r"(?:function)?" + re.escape(_DS_SEP) +
                    r"\s*([\w.-]+)\s*(?:```json\s*(.*?)\s*```|(.*?))\s*" + re.escape(_DS_END),
                    re.S)
_DS_V31_RE = re.compile(re.escape(_DS_BEGIN) + r"([\w.-]+)" + re.escape(_DS_SEP) + r"(.*?)" +
                        re.escape(_DS_END), re.S)


@dataclass
class Call:
    name: str
    arguments: str  # a JSON object, as the OpenAI API sends it

    def as_openai(self, index: int | None = None) -> dict:
        d = {"id": "call_" + secrets.token_hex(12), "type": "function",
             "function": {"name": self.name, "arguments": self.arguments}}
        return d if index is None else {"index": index, **d}


def family(template: str | None) -> str | None:
    if not template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if "tool▁call▁begin" in template:
        return DEEPSEEK
    return None


def start_marker(fam: str) -> str:
    """Text that opens the tool-call part of a reply (content before it is plain text)."""
    return "<tool_call>" if fam == HERMES else _DS_CALLS_BEGIN


def forced_parts(fam: str, names: list[str]) -> tuple[str, list[str], str, str]:
    """(text before the name, name options, text between name and arguments, text after the
    arguments object) of one forced call."""
    if fam == HERMES:
        return ('<tool_call>\n{"name": "', [n + '"' for n in names], ', "arguments": ',
                "}\n</tool_call>")
    return (_DS_CALLS_BEGIN + _DS_BEGIN + "function" + _DS_SEP, [n + "\n" for n in names],
            "```json\n", "\n```" + _DS_END + _DS_CALLS_END)


def _object_text(raw: str) -> str | None:
    try:
        v = json.loads(raw)
    except ValueError:
        return None
    return json.dumps(v, ensure_ascii=False) if isinstance(v, dict) else None


def parse(fam: str, text: str, names: set[str]) -> tuple[str, list[Call]]:
    """(content before the calls, calls) from generated text; calls to unknown functions or
    with arguments that are not a JSON object are left out (then the text stays content)."""
    calls: list[Call] = []
    if fam == HERMES:
        for m in _HERMES_RE.finditer(text):
            try:
                obj = json.loads(m.group(1))
            except ValueError:
                continue
            if not isinstance(obj, dict) or obj.get("name") not in names:
                continue
            args = obj.get("arguments", {})
            args = _object_text(args) if isinstance(args, str) else (
                json.dumps(args, ensure_ascii=False) if isinstance(args, dict) else None)
            if args is not None:
                calls.append(Call(obj["name"], args))
    else:
        found = [(m.group(1), m.group(2) if m.group(2) is not None else m.group(3))
                 for m in _DS_RE.finditer(text)]
        found = found or [(m.group(1), m.group(2)) for m in _DS_V31_RE.finditer(text)]
        for name, raw in found:
            args = _object_text(raw or "")
            if name in names and args is not None:
                calls.append(Call(name, args))
    if not calls:
        return text, []
    cut = text.find(start_marker(fam))
    if cut < 0 and fam == DEEPSEEK:
        cut = text.find(_DS_BEGIN)
    return (text[:cut].rstrip() if cut >= 0 else ""), calls


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates expect them (HF convention): tool-call arguments as
    objects, not JSON strings."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c["function"])
                try:
                    fn["arguments"] = json.loads(fn.get("arguments") or "{}")
                except ValueError:
                    pass  # a template that wants a string gets the string
                calls.append({**c, "function": fn, **fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


class MarkerSplit:
    """Streams content until a tool-call marker shows up; text that could be the start of the
    marker is held back (and let out at the end if it was not one)."""

    def __init__(self, marker: str) -> None:
        self.marker, self.buf, self.sent, self.hit = marker, "", 0, False

    def push(self, text: str) -> str:
        self.buf += text
        if self.hit:
            return ""
        i = self.buf.find(self.marker, max(0, self.sent - len(self.marker)))
        if i >= 0:
            self.hit = True
            out, self.sent = self.buf[self.sent:i], i
            return out
        keep = next((n for n in range(min(len(self.marker) - 1, len(self.buf)), 0, -1)
                     if self.buf.endswith(self.marker[:n])), 0)
        end = max(self.sent, len(self.buf) - keep)
        out, self.sent = self.buf[self.sent:end], end
        return out

    def rest(self) -> str:
        return self.buf[self.sent:]
