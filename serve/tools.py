"""Tool calls: which template family a container's chat template is, how a forced call is
written in it, and how calls are parsed back out of generated text.

Supported families (those of the models moepack converts):
  hermes   - Qwen2.5/Qwen3(-MoE), Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
  deepseek - DeepSeek V2.5/V3: <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}
             \\n```<｜tool▁call▁end｜> (the V3.1 form NAME<｜tool▁sep｜>{...} is parsed too)
  kimi     - Kimi K2: <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
             <|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>
  mistral  - Mixtral 8x22B Instruct (v3 tokenizer): [TOOL_CALLS] [{"name": ..., "arguments": ...}]
A template that mentions none of these cannot take tools: such requests get a 400."""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

HERMES, DEEPSEEK, KIMI, MISTRAL = "hermes", "deepseek", "kimi", "mistral"
_KIMI_SECTION, _KIMI_SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
_KIMI_RE = re.compile(r"<\|tool_call_begin\|>\s*(?:functions\.)?([\w.-]+?)(?::\d+)?\s*"
                      r"<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.S)
_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
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
    id: str = ""

    def as_openai(self, index: int | None = None) -> dict:
        d = {"id": self.id or "call_" + secrets.token_hex(12), "type": "function",
             "function": {"name": self.name, "arguments": self.arguments}}
        return d if index is None else {"index": index, **d}


def _call_id(fam: str, name: str, index: int) -> str:
    """Ids as the family's template wants them back (Kimi renders them into the prompt as
    functions.NAME:N; Mistral's template refuses anything but 9 letters and digits)."""
    if fam == KIMI:
        return f"functions.{name}:{index}"
    if fam == MISTRAL:
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return "call_" + secrets.token_hex(12)


def family(template: str | None) -> str | None:
    if not template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if "tool▁call▁begin" in template:
        return DEEPSEEK
    if "tool_calls_section_begin" in template:
        return KIMI
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    return None


def syntax(fam: str) -> tuple[str, ...]:
    """The marker tokens a family's calls are written with: special tokens in some
    vocabularies (Mistral's [TOOL_CALLS]), kept in the reply's text when tools are on so that
    `parse` finds the calls."""
    return {HERMES: ("<tool_call>", "</tool_call>"),
            DEEPSEEK: (_DS_CALLS_BEGIN, _DS_CALLS_END, _DS_BEGIN, _DS_SEP, _DS_END),
            KIMI: (_KIMI_SECTION, _KIMI_SECTION_END, "<|tool_call_begin|>",
                   "<|tool_call_argument_begin|>", "<|tool_call_end|>"),
            MISTRAL: ("[TOOL_CALLS]",)}[fam]


def start_marker(fam: str) -> str:
    """Text that opens the tool-call part of a reply (content before it is plain text)."""
    return {HERMES: "<tool_call>", DEEPSEEK: _DS_CALLS_BEGIN, KIMI: _KIMI_SECTION,
            MISTRAL: "[TOOL_CALLS]"}[fam]


def forced_parts(fam: str, names: list[str]) -> tuple[str, list[str], str, str]:
    """(text before the name, name options, text between name and arguments, text after the
    arguments object) of one forced call."""
    if fam == HERMES:
        return ('<tool_call>\n{"name": "', [n + '"' for n in names], ', "arguments": ',
                "}\n</tool_call>")
    if fam == KIMI:
        return (_KIMI_SECTION + "<|tool_call_begin|>functions.", [n + ":0" for n in names],
                "<|tool_call_argument_begin|>", "<|tool_call_end|>" + _KIMI_SECTION_END)
    if fam == MISTRAL:
        return ('[TOOL_CALLS] [{"name": "', [n + '"' for n in names], ', "arguments": ', "}]")
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
    elif fam == MISTRAL:
        calls = _parse_mistral(text, names)
    else:
        if fam == KIMI:
            found = [(m.group(1), m.group(2)) for m in _KIMI_RE.finditer(text)]
        else:
            found = [(m.group(1), m.group(2) if m.group(2) is not None else m.group(3))
                     for m in _DS_RE.finditer(text)]
            found = found or [(m.group(1), m.group(2)) for m in _DS_V31_RE.finditer(text)]
        for name, raw in found:
            args = _object_text(raw or "")
            if name in names and args is not None:
                calls.append(Call(name, args))
    for i, c in enumerate(calls):
        c.id = _call_id(fam, c.name, i)
    if not calls:
        return text, []
    cut = text.find(start_marker(fam))
    if cut < 0 and fam == DEEPSEEK:
        cut = text.find(_DS_BEGIN)
    return (text[:cut].rstrip() if cut >= 0 else ""), calls


def _parse_mistral(text: str, names: set[str]) -> list[Call]:
    """[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...] (a JSON list after the marker)."""
    at = text.find("[TOOL_CALLS]")
    if at < 0:
        return []
    try:
        items, _ = json.JSONDecoder().raw_decode(text[at + len("[TOOL_CALLS]"):].lstrip())
    except ValueError:
        return []
    calls = []
    for it in items if isinstance(items, list) else []:
        if isinstance(it, dict) and it.get("name") in names and isinstance(
                it.get("arguments"), dict):
            calls.append(Call(it["name"], json.dumps(it["arguments"], ensure_ascii=False)))
    return calls


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
