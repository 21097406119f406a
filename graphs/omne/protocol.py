"""Omne's text protocol (Qwen2.5's tool calls): a reply read tolerantly into tool calls or an answer, invented
`<tool_response>` blocks dropped, calls checked and keyed for repeats, and a teacher's reply rewritten in the
canonical form SFT teaches."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.messages.tool import invalid_tool_call, tool_call

from mhqa_graph.errors import MhqaError
from mhqa_graph.parsing import close_json, extract_json, extract_tag, json_spans
from mhqa_graph.tools import pick_graph

from ..calls import clean_answer

# canonical argument -> the names small models use for it
_MAIN_ARG = {
    "entity_matcher": ("query", ("query", "text", "entity", "name", "entity_name", "keyword")),
    "node_info": ("entity", ("entity", "name", "node", "node_name", "entity_name", "query")),
}

_GRAPH_ARGS = ("graph_type", "graph", "graph_name", "kg")

_NAME_KEYS = ("name", "tool", "tool_name", "function")

_ARGS_KEYS = ("arguments", "args", "parameters", "params", "input")

_CLOSED_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)

_LEADING_THINK = re.compile(r"\s*(<think>.*?</think>)", re.DOTALL | re.IGNORECASE)

_STRAY_THINK = re.compile(r"</?think>", re.IGNORECASE)

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|$)", re.DOTALL | re.IGNORECASE)

_RESPONSE = re.compile(r"<tool_response>", re.IGNORECASE)

_ANSWER_BLOCK = re.compile(r"<answer>.*?(?:</answer>|$)", re.DOTALL | re.IGNORECASE)

# -- the text protocol -------------------------------------------------------------------
def _read_call(value: Any) -> dict:
    """{"name", "args", "error"} from one parsed call, accepting the usual variants: "args" or
    "parameters" for "arguments", arguments as a JSON string, OpenAI's {"function": {...}},
    {"node_info": {...}}, or the arguments at the top level."""
    if not isinstance(value, dict):
        return {"name": "", "args": {}, "error": "a tool call must be a JSON object"}
    if isinstance(value.get("function"), dict):
        return _read_call(value["function"])
    name = next((value[k] for k in _NAME_KEYS if k in value), None)
    args = next((value[k] for k in _ARGS_KEYS if k in value), None)
    if name is None and len(value) == 1 and next(iter(value)) not in _ARGS_KEYS \
            and isinstance(next(iter(value.values())), dict):
        name, args = next(iter(value.items()))
    if args is None:
        args = {k: v for k, v in value.items() if k not in _NAME_KEYS and k != "type"}
    if isinstance(args, str):
        args = extract_json(args, dict) if args.strip() else {}
    if not isinstance(name, str) or not name.strip():
        return {"name": "", "args": {}, "error": 'the tool call has no "name"'}
    if not isinstance(args, dict):
        return {"name": name.strip(), "args": {}, "error": '"arguments" must be a JSON object'}
    return {"name": name.strip(), "args": args, "error": None}

@dataclass
class Reply:
    calls: list[dict]  # {"name", "args", "error", "raw"}, in the order written
    answer: str | None  # None when there are calls: they run first
    kept: str  # the reply as it enters the conversation: through its last call, nothing after it
    invented: int = 0  # <tool_response> blocks the model wrote itself
    dropped_answer: bool = False  # an <answer> beside calls


def _blank(match: re.Match) -> str:
    return " " * len(match.group())


def parse_reply(text: str) -> Reply:
    """The tool calls and the answer of a model reply, read tolerantly: <tool_call> blocks, else bare
    JSON calls (objects or lists) of the known tools; everything from the first <tool_response> on is
    invented and ignored."""
    invented = len(_RESPONSE.findall(text))
    first = _RESPONSE.search(text)
    cut = text[:first.start()] if first else text
    masked = _STRAY_THINK.sub(_blank, _CLOSED_THINK.sub(_blank, cut))  # same length: positions hold
    calls: list[dict] = []
    end = 0
    for block in _TOOL_CALL.finditer(masked):
        value = extract_json(close_json(block.group(1)), (dict, list))
        if value is None:
            read = [{"name": "", "args": {}, "error": "the tool call is not valid JSON"}]
        else:
            read = [_read_call(v) for v in (value if isinstance(value, list) else [value])]
        calls += [dict(call, raw=block.group(1).strip()[:500]) for call in read]
        end = block.end()
    if not calls:  # bare JSON calls without the tags
        for start, stop, value in json_spans(_ANSWER_BLOCK.sub(_blank, masked)):
            read = [c for c in (_read_call(v) for v in (value if isinstance(value, list) else [value]))
                    if c["name"] in _MAIN_ARG and not c["error"]]
            if read:
                calls += [dict(c, raw=masked[start:stop][:500]) for c in read]
                end = stop
    answer = extract_tag(_TOOL_CALL.sub(_blank, masked), "answer")
    answer = clean_answer(answer) if answer else None
    if calls:
        return Reply(calls, None, cut[:end].rstrip(), invented, dropped_answer=bool(answer))
    return Reply([], answer or None, cut.rstrip(), invented)


def call_text(calls: list[dict]) -> str:
    """Calls ({name, args}) as the system prompt asks the model to write them: one <tool_call> block each."""
    return "\n".join("<tool_call>\n" + json.dumps({"name": call["name"], "arguments": call["args"]},
                                                  ensure_ascii=False) + "\n</tool_call>" for call in calls)


def canonical_reply(text: str) -> str:
    """`text` as the system prompt asks for it: its <think> block, then each call `parse_reply` reads as a
    <tool_call> block of strict JSON, or its <answer>. A teacher's bare JSON call becomes a tagged one, so
    SFT on its trajectories teaches the protocol; a reply with a malformed call or neither stays as it is."""
    reply = parse_reply(text)
    if reply.calls and not any(call["error"] for call in reply.calls):
        body = call_text(reply.calls)
    elif not reply.calls and reply.answer:
        body = f"<answer>{reply.answer}</answer>"
    else:
        return text
    think = _LEADING_THINK.match(text)
    return f"{think.group(1)}\n{body}" if think else body


def ai_message(text: str, calls: list[dict], round_no: int) -> AIMessage:
    ok, bad = [], []
    for i, call in enumerate(calls):
        call_id = f"call_{round_no}_{i}"
        if call["error"]:
            bad.append(invalid_tool_call(name=call["name"] or None, args=call["raw"], id=call_id,
                                         error=call["error"]))
        else:
            ok.append(tool_call(name=call["name"], args=call["args"], id=call_id))
    return AIMessage(text, tool_calls=ok, invalid_tool_calls=bad)

# -- tools ---------------------------------------------------------------------------------
def check_args(name: str, args: dict, graphs: list[str]) -> dict | str:
    """The canonical arguments of a call ({main argument, graph_type}, whitespace-normalised), or
    the error text the model is shown. With a single graph, any graph_type means that graph."""
    if name not in _MAIN_ARG:
        return f"Error: unknown tool {name!r}; the tools are {' and '.join(_MAIN_ARG)}."
    key, aliases = _MAIN_ARG[name]
    value = next((args[a] for a in aliases if a in args), None)
    if value is None:
        return f'Error: {name} needs the argument "{key}" (a string) and optionally "graph_type".'
    if not isinstance(value, str) or not value.strip():
        return f'Error: argument "{key}" of {name} must be a non-empty string, got {json.dumps(value)[:80]}.'
    graph = next((args[a] for a in _GRAPH_ARGS if a in args), None) or (graphs[0] if graphs else "")
    if not isinstance(graph, str):
        return f'Error: argument "graph_type" of {name} must be a string, got {json.dumps(graph)[:80]}.'
    graph = graph.strip()
    if graphs:
        try:
            graph = pick_graph(graph, graphs)
        except MhqaError as exc:
            return f"Error: {exc}."
    return {key: " ".join(value.split()), "graph_type": graph}


def call_key(name: str, args: dict) -> str:
    return name + json.dumps(args, sort_keys=True, default=str)


def call_order(call: dict) -> int:
    """Text-mode calls keep the order they were written in (their ids end in their index)."""
    tail = str(call.get("id") or "").rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else 0
