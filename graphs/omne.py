"""Omne (arXiv 2508.17330): a tool agent that answers multi-hop questions by walking a schema-free
knowledge graph with two tools, `entity_matcher` and `node_info`, each taking a `graph_type`.

The model speaks a text protocol any chat model can follow (Qwen2.5's): an optional <think>…</think>,
then <tool_call>{json}</tool_call> blocks or an <answer>…</answer>. Parsed calls become
`AIMessage.tool_calls`, results become `ToolMessage`s; both are rendered back as text (results inside
<tool_response>) for the next model call.

    start -> agent <-> tools          (at most ctx.max_rounds model turns)
               |-> END                 (an <answer>, or a ModelError)
               '-> final -> END        (round cap, or no action after the repair nudge: forced answer)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import (
    Annotated,
    Any,
    NotRequired,  # pydantic needs these on 3.11 (Studio schemas)
)

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.tool import invalid_tool_call, tool_call
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from typing_extensions import TypedDict

from mhqa_graph.errors import MhqaError, ModelError
from mhqa_graph.parsing import close_json, extract_json, extract_tag
from mhqa_graph.tools import entity_matcher_tool, node_info_tool

from . import omne_prompts as P
from .common import AgentContext, QAInput, QAOutput, ask, check_question, clean_answer, context_as, get_llm, get_store

ROLE = "tool-agent"
PREVIEW_CHARS = 200
# canonical argument -> the names small models use for it
_MAIN_ARG = {
    "entity_matcher": ("query", ("query", "text", "entity", "name", "entity_name", "keyword")),
    "node_info": ("entity", ("entity", "name", "node", "node_name", "entity_name", "query")),
}
_GRAPH_ARGS = ("graph_type", "graph", "graph_name", "kg")
_NAME_KEYS = ("name", "tool", "tool_name", "function")
_ARGS_KEYS = ("arguments", "args", "parameters", "params", "input")

_CLOSED_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_STRAY_THINK = re.compile(r"</?think>", re.IGNORECASE)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|$)", re.DOTALL | re.IGNORECASE)


@dataclass
class OmneContext(AgentContext):
    max_calls_per_round: int = 5  # tool calls run per model turn; further calls get an error result


class ToolCallRecord(TypedDict):
    name: str
    args: dict[str, Any]
    result_preview: str
    repeated: bool  # same name and normalised args as an earlier call: not run again


class OmneOutput(QAOutput):
    rounds: int
    tool_calls: list[ToolCallRecord]
    repeated_calls: int
    messages: NotRequired[list[AnyMessage]]


class OmneState(TypedDict):
    question: str
    topic_entities: NotRequired[list[str]]
    graphs: list[str]  # the graph_type values of this run
    messages: Annotated[list[AnyMessage], add_messages]  # the conversation, without the system prompt
    rounds: int  # agent model turns so far (the forced final-answer call is not one)
    nudges: int  # replies with neither a tool call nor an answer
    tool_calls: list[ToolCallRecord]
    repeated_calls: int
    answer: str
    error: str | None




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
    answer: str | None


def parse_reply(text: str) -> Reply:
    """The tool calls and the answer of a model reply, read tolerantly."""
    body = _STRAY_THINK.sub("", _CLOSED_THINK.sub("", text))
    calls: list[dict] = []
    for block in _TOOL_CALL.findall(body):
        value = extract_json(close_json(block), (dict, list))
        if value is None:
            read = [{"name": "", "args": {}, "error": "the tool call is not valid JSON"}]
        else:
            read = [_read_call(v) for v in (value if isinstance(value, list) else [value])]
        calls += [dict(call, raw=block.strip()[:500]) for call in read]
    answer = extract_tag(_TOOL_CALL.sub("", body), "answer")
    answer = clean_answer(answer) if answer else None
    if not calls and not answer:  # a bare JSON call without the tags
        value = extract_json(body, dict)
        if value is not None and (call := _read_call(value))["name"] in _MAIN_ARG and not call["error"]:
            calls.append(dict(call, raw=json.dumps(value)))
    return Reply(calls=calls, answer=answer or None)


def _tool_specs(graphs: list[str]) -> str:
    specs = []
    for spec in P.TOOL_SPECS:
        spec = json.loads(json.dumps(spec))
        if graphs:
            spec["parameters"]["properties"]["graph_type"]["enum"] = graphs
        specs.append(json.dumps(spec))
    return "\n".join(specs)


def render_prompt(ctx: OmneContext, graphs: list[str], messages: list[BaseMessage]) -> list[BaseMessage]:
    """The model's view of the conversation: a system prompt with the tools, then plain-text turns,
    consecutive tool results joined into one user turn of <tool_response> blocks."""
    system = P.SYSTEM.format(graph_types=", ".join(graphs) or "(none configured)", tools=_tool_specs(graphs),
                             think=P.THINK_ON if ctx.think else P.THINK_OFF)
    prompt: list[BaseMessage] = [SystemMessage(system)]
    responses: list[str] = []
    for m in messages:
        if isinstance(m, ToolMessage):
            responses.append(f"<tool_response>\n{m.text}\n</tool_response>")
            continue
        if responses:
            prompt.append(HumanMessage("\n".join(responses)))
            responses = []
        prompt.append(AIMessage(m.text) if isinstance(m, AIMessage) else HumanMessage(m.text))
    if responses:
        prompt.append(HumanMessage("\n".join(responses)))
    return prompt


def _ai_message(text: str, calls: list[dict], round_no: int) -> AIMessage:
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
    the error text the model is shown."""
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
    return {key: " ".join(value.split()), "graph_type": graph.strip()}


def _call_key(name: str, args: dict) -> str:
    return name + json.dumps(args, sort_keys=True, default=str)


# -- nodes ---------------------------------------------------------------------------------
def start(state: OmneState, runtime: Runtime[OmneContext]) -> dict:
    ctx = context_as(OmneContext, runtime)
    question = check_question(state.get("question"))
    update: dict[str, Any] = {"question": question, "rounds": 0, "nudges": 0, "tool_calls": [], "repeated_calls": 0,
                              "answer": "", "error": None, "graphs": []}
    try:
        graphs = [g.strip() for g in ctx.graph.split(",") if g.strip()] if ctx.graph else get_store(ctx).graphs()
    except MhqaError as exc:  # the store cannot be opened or listed
        return {**update, "error": f"{type(exc).__name__}: {exc}", "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES)]}
    text = P.QUESTION.format(question=question)
    entities = [e.strip() for e in state.get("topic_entities") or [] if isinstance(e, str) and e.strip()]
    if entities:
        text += "\n" + P.TOPIC_ENTITIES.format(entities=", ".join(entities))
    return {**update, "graphs": graphs, "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), HumanMessage(text)]}


def agent(state: OmneState, runtime: Runtime[OmneContext]) -> dict:
    """One model turn: tool calls, an answer, or (once) a nudge to do one of the two."""
    ctx = context_as(OmneContext, runtime)
    round_no = state["rounds"] + 1
    try:
        text = ask(get_llm(ctx, ROLE), render_prompt(ctx, state["graphs"], state["messages"]))
    except ModelError as exc:
        return {"rounds": round_no, "error": f"ModelError: {exc}"}
    reply = parse_reply(text)
    if reply.calls:
        return {"rounds": round_no, "messages": [_ai_message(text, reply.calls, round_no)]}
    if reply.answer:
        return {"rounds": round_no, "messages": [AIMessage(text)], "answer": reply.answer}
    nudge = [HumanMessage(P.NUDGE)] if state["nudges"] == 0 else []
    return {"rounds": round_no, "nudges": state["nudges"] + 1, "messages": [AIMessage(text), *nudge]}


def tools(state: OmneState, runtime: Runtime[OmneContext]) -> dict:
    """Run the calls of the last turn. Bad calls and repeats get a text result, never an exception."""
    ctx = context_as(OmneContext, runtime)
    graphs = state["graphs"]
    last = state["messages"][-1]
    calls = sorted([*last.tool_calls, *last.invalid_tool_calls], key=lambda c: int(c["id"].rsplit("_", 1)[1]))
    runners: dict[str, Any] = {}
    seen = {_call_key(r["name"], r["args"]) for r in state["tool_calls"]}
    records: list[ToolCallRecord] = []
    results: list[ToolMessage] = []
    for i, call in enumerate(calls):
        name, args, repeated = call["name"] or "", call["args"], False
        if i >= ctx.max_calls_per_round:
            text = P.TOO_MANY_CALLS.format(limit=ctx.max_calls_per_round)
        elif call.get("type") == "invalid_tool_call":
            text = f"Error: {call['error']}. Write the call as " \
                   '{"name": "<tool>", "arguments": {...}} inside <tool_call></tool_call> tags.'
            args = {"raw": args}
        else:
            checked = check_args(name, args, graphs)
            key = _call_key(name, checked if isinstance(checked, dict) else args)
            repeated = key in seen
            seen.add(key)
            if repeated:
                text = P.REPEATED.format(name=name)
            elif isinstance(checked, str):
                text = checked
            else:
                try:
                    if not runners:
                        store = get_store(ctx)
                        runners = {"entity_matcher": entity_matcher_tool(store, graphs, k=ctx.top_k),
                                   "node_info": node_info_tool(store, graphs)}
                    text = str(runners[name].invoke(checked))
                except (MhqaError, ValueError) as exc:  # store cannot be opened; tool input validation
                    text = f"Error: {exc}"
            if isinstance(checked, dict):
                args = checked
        records.append({"name": name, "args": args, "result_preview": text[:PREVIEW_CHARS], "repeated": repeated})
        results.append(ToolMessage(text, tool_call_id=call["id"], name=name or "invalid",
                                   status="error" if text.startswith("Error") else "success"))
    n_repeated = sum(r["repeated"] for r in records)
    return {"messages": results, "tool_calls": state["tool_calls"] + records,
            "repeated_calls": state["repeated_calls"] + n_repeated}


def final(state: OmneState, runtime: Runtime[OmneContext]) -> dict:
    """The forced final-answer call: no more tools, answer from what was found."""
    ctx = context_as(OmneContext, runtime)
    force = HumanMessage(P.FORCE_ANSWER)
    try:
        text = ask(get_llm(ctx, ROLE), render_prompt(ctx, state["graphs"], [*state["messages"], force]))
    except ModelError as exc:
        return {"messages": [force], "error": f"ModelError: {exc}"}
    reply = parse_reply(text)
    if reply.answer:
        return {"messages": [force, AIMessage(text)], "answer": reply.answer, "error": None}
    best_effort = clean_answer(_STRAY_THINK.sub("", _TOOL_CALL.sub("", _CLOSED_THINK.sub("", text))))
    return {"messages": [force, AIMessage(text)], "answer": best_effort,
            "error": f"MalformedOutput: no <answer> in the forced final reply after {state['rounds']} rounds"}


# -- routing -------------------------------------------------------------------------------
def _after_start(state: OmneState, runtime: Runtime[OmneContext]) -> str:
    if state["error"]:
        return END
    return "agent" if context_as(OmneContext, runtime).max_rounds > 0 else "final"


def _after_agent(state: OmneState, runtime: Runtime[OmneContext]) -> str:
    if state["error"] or state["answer"]:
        return END
    last = state["messages"][-1]
    if isinstance(last, AIMessage) and (last.tool_calls or last.invalid_tool_calls):
        return "tools"
    if isinstance(last, HumanMessage) and state["rounds"] < context_as(OmneContext, runtime).max_rounds:
        return "agent"  # after the nudge
    return "final"


def _after_tools(state: OmneState, runtime: Runtime[OmneContext]) -> str:
    return "agent" if state["rounds"] < context_as(OmneContext, runtime).max_rounds else "final"


def build(checkpointer: Any = None) -> CompiledStateGraph:
    g = StateGraph(OmneState, context_schema=OmneContext, input_schema=QAInput, output_schema=OmneOutput)
    g.add_node("start", start)
    g.add_node("agent", agent)
    g.add_node("tools", tools)
    g.add_node("final", final)
    g.add_edge(START, "start")
    g.add_conditional_edges("start", _after_start, ["agent", "final", END])
    g.add_conditional_edges("agent", _after_agent, ["tools", "agent", "final", END])
    g.add_conditional_edges("tools", _after_tools, ["agent", "final"])
    g.add_edge("final", END)
    return g.compile(checkpointer=checkpointer)


graph = build()
