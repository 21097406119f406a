"""Omne (arXiv 2508.17330): a tool agent that answers multi-hop questions by walking a schema-free
knowledge graph with two tools, `entity_matcher` and `node_info`, each taking a `graph_type`.

Two ways to talk to the model (context `tool_mode`):
- `text` (local packs, training): a protocol any chat model can follow (Qwen2.5's). The model writes an
  optional <think>…</think>, then <tool_call>{json}</tool_call> blocks (or bare JSON calls) or an
  <answer>…</answer>. Generation stops at <tool_response>: results are the system's to write. Every call
  of a turn is read, and calls win over an <answer> in the same turn (that answer is dropped and
  counted). Whatever the model wrote after its calls, invented results included, never enters the
  conversation (`invented_results` counts them). Parsed calls become `AIMessage.tool_calls`, results
  `ToolMessage`s, rendered back as text (results inside <tool_response>) for the next call.
- `native`: the chat model's own tool calling (`bind_tools`: OpenAI-compatible servers such as vLLM with a
  tool parser, API models); `AIMessage.tool_calls` and `ToolMessage`s go to the model as they are.
  `auto` (default) picks native when the model class implements `bind_tools`, else text.

Tool results are capped (`result_chars`), the facts most relevant to the question first. The system
prompt and the question are never cut: when the conversation outgrows `context_chars`, the oldest tool
results are shortened first, and when not even that leaves room for another round the run goes to
the forced answer.

Reply format (text mode), e.g. for `fake_llms(**{"tool-agent": [...]})`:
    <think>...</think>
    <tool_call>
    {"name": "entity_matcher", "arguments": {"query": "Inception", "graph_type": "films"}}
    </tool_call>
and finally `<think>...</think><answer>Brendan Nolan</answer>`.

Departures from the paper, as guards (graphs/guards/; switchable, recorded in `guards`): an answer is
sent back once (the model's only nudge) when no fact the run was sent contains it (`send_back_ungrounded`:
copied from the prompt's example, made up, or picked from entity_matcher's list of names), or when it is
one hop short (`send_back_one_hop`: an entity the run never looked into, with relations that the question
asks about and the walk has not covered, such as the father for "where was X's father buried?"). Both
checks are in `guard_rules`; the text protocol's parsing is in `protocol`.

Typed errors in `error` (the answer, if any, still stands): `NoToolCall` (answered without one successful
tool call), `RoundCap` (no answer within `max_rounds`), `MalformedOutput` (no <answer> in the forced
reply), `ModelError`.

    start -> agent <-> tools          (at most ctx.max_rounds model turns)
      '----------------^              (`start_from`, e.g. auto's hand-over: those entities' facts first)
               |-> END                 (an <answer>, or a ModelError)
               '-> final -> END        (round cap, or no action after the repair nudge: forced answer)
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime

from mhqa_graph.errors import InvalidInput, MhqaError, ModelError
from mhqa_graph.messages import FORCED_FINAL, HANDED_OVER, KIND, NUDGE, SEND_BACK, marked, tagged
from mhqa_graph.parsing import final_answer
from mhqa_graph.replies import answer_reply
from mhqa_graph.text import topic_entities
from mhqa_graph.tools import entity_matcher_tool, node_info_tool

from ..calls import ask, ask_message, chat_model, clean_answer, get_llm, get_store, supports_tool_calling
from ..settings import check_question, context_as
from . import prompts as P
from .guard_rules import send_back
from .protocol import ai_message, call_key, call_order, call_text, check_args, parse_reply
from .state import ROLE, OmneContext, OmneInput, OmneOutput, OmneState, ToolCallRecord

PREVIEW_CHARS = 200


def _tool_specs(graphs: list[str]) -> list[dict]:
    specs = json.loads(json.dumps(P.TOOL_SPECS))
    for spec in specs:
        if graphs:
            spec["parameters"]["properties"]["graph_type"]["enum"] = graphs
    return specs


def _system(ctx: OmneContext, graphs: list[str], native: bool) -> SystemMessage:
    names = ", ".join(graphs) or "(none configured)"
    if native:
        return SystemMessage(P.NATIVE_SYSTEM.format(graph_types=names))
    thinks = P.EXAMPLE_THINKS if ctx.think else ("",) * len(P.EXAMPLE_THINKS)
    return SystemMessage(P.SYSTEM.format(
        graph_types=names, tools="\n".join(json.dumps(s) for s in _tool_specs(graphs)),
        think=P.THINK_ON if ctx.think else P.THINK_OFF,
        **{f"example_think{i}": t for i, t in enumerate(thinks, start=1)}))


def _fit(messages: list[BaseMessage], budget: int) -> tuple[list[BaseMessage], bool]:
    """The conversation within `budget` characters: tool results other than the last turn's are cut
    to a stub, oldest first. Returns (messages, whether they fit)."""
    size = sum(len(m.text) for m in messages)
    out = list(messages)
    last_ai = max((i for i, m in enumerate(out) if isinstance(m, AIMessage)), default=len(out))
    for i, m in enumerate(out):
        if size <= budget:
            break
        if isinstance(m, ToolMessage) and i < last_ai:
            stub = P.RESULT_CUT.format(head=" ".join(m.text.split())[:80])
            if len(stub) < len(m.text):
                size -= len(m.text) - len(stub)
                out[i] = m.model_copy(update={"content": stub})
    return out, size <= budget


def render_prompt(ctx: OmneContext, graphs: list[str], messages: list[BaseMessage],
                  native: bool = False) -> list[BaseMessage]:
    """The model's view of the conversation: the system prompt, then the turns, old tool results cut to
    fit `context_chars`. In text mode the turns are plain text, consecutive tool results joined into one
    user turn of <tool_response> blocks; in native mode they go as they are."""
    system = _system(ctx, graphs, native)
    fitted, _ = _fit(messages, ctx.context_chars - len(system.text))
    if native:
        return [system, *fitted]
    prompt: list[BaseMessage] = [system]
    responses: list[str] = []
    for m in fitted:
        if isinstance(m, ToolMessage):
            responses.append(f"<tool_response>\n{m.text}\n</tool_response>")
            continue
        if responses:
            prompt.append(HumanMessage("\n".join(responses)))
            responses = []
        kept = {k: v for k, v in m.additional_kwargs.items() if k == KIND}  # its kind
        prompt.append((AIMessage if isinstance(m, AIMessage) else HumanMessage)(m.text, additional_kwargs=kept))
    if responses:
        prompt.append(HumanMessage("\n".join(responses)))
    return prompt


def room_for_a_round(ctx: OmneContext, graphs: list[str], messages: list[BaseMessage]) -> bool:
    """Whether the conversation, old results cut, leaves room for another reply and its results."""
    need = 4 * ctx.max_new_tokens + ctx.result_chars
    _, fits = _fit(messages, ctx.context_chars - len(_system(ctx, graphs, False).text) - need)
    return fits


# -- nodes ---------------------------------------------------------------------------------
def _native(ctx: OmneContext) -> bool:
    if ctx.tool_mode not in ("auto", "native", "text"):
        raise InvalidInput(f"tool_mode must be auto, native or text, got {ctx.tool_mode!r}")
    if ctx.tool_mode == "auto":
        return supports_tool_calling(chat_model(ctx, ROLE))
    if ctx.tool_mode == "native" and not supports_tool_calling(model := chat_model(ctx, ROLE)):
        raise InvalidInput(f"tool_mode=native: {type(model).__name__} has no native tool calling (bind_tools); "
                           "use tool_mode=text or auto")
    return ctx.tool_mode == "native"


def start(state: OmneState, runtime: Runtime[OmneContext]) -> dict:
    ctx = context_as(OmneContext, runtime)
    question = check_question(state.get("question"))
    update: dict[str, Any] = {"question": question, "rounds": 0, "nudges": 0, "tool_calls": [], "repeated_calls": 0,
                              "invented_results": 0, "dropped_answers": 0, "guards": [], "answer": "", "error": None,
                              "graphs": [], "native": False}
    try:
        graphs = [g.strip() for g in ctx.graph.split(",") if g.strip()] if ctx.graph else get_store(ctx).graphs()
        native = _native(ctx)
    except MhqaError as exc:  # the store cannot be opened or listed; no model
        return {**update, "error": f"{type(exc).__name__}: {exc}", "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES)]}
    text = P.QUESTION.format(question=question)
    entities = topic_entities(state.get("topic_entities"))
    if entities:
        text += "\n" + P.TOPIC_ENTITIES.format(entities=", ".join(entities))
    return {**update, "graphs": graphs, "native": native,
            "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), HumanMessage(text),
                         *(handed_over(state.get("start_from") or [], graphs, ctx.max_calls_per_round, native)
                           if ctx.max_rounds > 0 else [])]}


def handed_over(entities: list[Any], graphs: list[str], limit: int, native: bool) -> list[AIMessage]:
    """The walk's first step when an earlier stage found where it starts: node_info on each of `entities` (names,
    or {"entity", "graph"}; at most `limit`), written as the model writes a call (its text protocol's block; no
    text in native mode) and tagged `handed_over`; the tools node runs them."""
    calls, seen = [], set()
    for item in entities:
        name, graph = (item.get("entity"), item.get("graph")) if isinstance(item, dict) else (item, None)
        name = " ".join(str(name or "").split())
        graph = graph if graph in graphs else graphs[0] if graphs else ""
        if name and (name, graph) not in seen and len(calls) < limit:
            seen.add((name, graph))
            calls.append({"name": "node_info", "args": {"entity": name, "graph_type": graph}, "error": None})
    if not calls:
        return []
    return [marked(HANDED_OVER, ai_message("" if native else call_text(calls), calls, 0))]


def _native_turn(ctx: OmneContext, state: OmneState, round_no: int) -> dict:
    llm = get_llm(ctx, ROLE, tools=[{"type": "function", "function": s} for s in _tool_specs(state["graphs"])])
    reply = ask_message(llm, render_prompt(ctx, state["graphs"], state["messages"], native=True))
    calls = getattr(reply, "tool_calls", None) or []
    message = AIMessage(reply.text, tool_calls=calls, invalid_tool_calls=getattr(reply, "invalid_tool_calls", []),
                        id=reply.id)
    if calls or message.invalid_tool_calls:
        return {"rounds": round_no, "messages": [message]}
    answer = clean_answer(final_answer(reply.text)) if reply.text.strip() else ""
    if answer:
        return _answer_or_send_back(ctx, state, round_no, answer, message)
    nudge = [tagged(NUDGE, P.NUDGE)] if state["nudges"] == 0 else []
    return {"rounds": round_no, "nudges": state["nudges"] + 1, "messages": [message, *nudge]}


def agent(state: OmneState, runtime: Runtime[OmneContext]) -> dict:
    """One model turn: tool calls, an answer, or (once) a nudge to do one of the two."""
    ctx = context_as(OmneContext, runtime)
    round_no = state["rounds"] + 1
    try:
        if state["native"]:
            return _native_turn(ctx, state, round_no)
        llm = get_llm(ctx, ROLE, reply=P.tool_format(state["graphs"], ctx.think, ctx.max_calls_per_round))
        text = ask(llm, render_prompt(ctx, state["graphs"], state["messages"]), stop=P.STOP)
    except ModelError as exc:
        return {"rounds": round_no, "error": f"ModelError: {exc}"}
    reply = parse_reply(text)
    counts = {"invented_results": state["invented_results"] + reply.invented,
              "dropped_answers": state["dropped_answers"] + reply.dropped_answer}
    if reply.calls:
        return {**counts, "rounds": round_no, "messages": [ai_message(reply.kept, reply.calls, round_no)]}
    if reply.answer:
        return {**counts, **_answer_or_send_back(ctx, state, round_no, reply.answer, AIMessage(reply.kept))}
    nudge = [tagged(NUDGE, P.NUDGE)] if state["nudges"] == 0 else []
    return {**counts, "rounds": round_no, "nudges": state["nudges"] + 1,
            "messages": [AIMessage(reply.kept), *nudge]}


def _answer_or_send_back(ctx: OmneContext, state: OmneState, round_no: int, answer: str, said: AIMessage) -> dict:
    """The answer, or once per run (guards `send_back_ungrounded` and `send_back_one_hop`: `guard_rules.send_back`)
    the answer sent back with the facts that it skipped."""
    firings = list(state.get("guards") or [])
    if state["nudges"] == 0 and round_no < ctx.max_rounds and (text := send_back(ctx, state, answer, firings)):
        return {"rounds": round_no, "nudges": 1, "messages": [said, tagged(SEND_BACK, text)], "guards": firings}
    return {"rounds": round_no, "messages": [said], "answer": answer, "guards": firings}


def tools(state: OmneState, runtime: Runtime[OmneContext]) -> dict:
    """Run the calls of the last turn. Bad calls and repeats get a text result, never an exception."""
    ctx = context_as(OmneContext, runtime)
    graphs = state["graphs"]
    last = state["messages"][-1]
    calls = sorted([*last.tool_calls, *last.invalid_tool_calls], key=call_order)
    runners: dict[str, Any] = {}
    seen = {call_key(r["name"], r["args"]) for r in state["tool_calls"]}
    records: list[ToolCallRecord] = []
    results: list[ToolMessage] = []
    for i, call in enumerate(calls):
        name, args, repeated = call["name"] or "", call["args"], False
        if i >= ctx.max_calls_per_round:
            text = P.TOO_MANY_CALLS.format(limit=ctx.max_calls_per_round)
        elif call.get("type") == "invalid_tool_call":
            text = f"Error: {call['error'] or 'unreadable call'}. Write the call as " \
                   '{"name": "<tool>", "arguments": {...}} inside <tool_call></tool_call> tags.'
            args = {"raw": args}
        else:
            checked = check_args(name, args if isinstance(args, dict) else {}, graphs)
            key = call_key(name, checked if isinstance(checked, dict) else args)
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
                        runners = {"entity_matcher": entity_matcher_tool(store, graphs, k=ctx.top_k, describe=True,
                                                                     question=state["question"]),
                                   "node_info": node_info_tool(store, graphs, max_chars=ctx.result_chars,
                                                               question=state["question"])}
                    text = str(runners[name].invoke(checked))
                except (MhqaError, ValueError) as exc:  # store cannot be opened; tool input validation
                    text = f"Error: {exc}"
            if isinstance(checked, dict):
                args = checked
        records.append({"name": name, "args": args, "result_preview": text[:PREVIEW_CHARS], "repeated": repeated})
        results.append(ToolMessage(text, tool_call_id=call["id"] or f"call_{i}", name=name or "invalid",
                                   status="error" if text.startswith("Error") else "success"))
    n_repeated = sum(r["repeated"] for r in records)
    return {"messages": results, "tool_calls": state["tool_calls"] + records,
            "repeated_calls": state["repeated_calls"] + n_repeated}


def _succeeded(state: OmneState) -> bool:
    return any(not r["repeated"] and not r["result_preview"].startswith("Error") for r in state["tool_calls"])


def finish(state: OmneState) -> dict:
    """An answer given without one successful tool call is recorded as NoToolCall."""
    if state["error"] or _succeeded(state):
        return {}
    return {"error": "NoToolCall: answered without a successful tool call"}


def final(state: OmneState, runtime: Runtime[OmneContext]) -> dict:
    """The forced final-answer call: no more tools, answer from what was found."""
    ctx = context_as(OmneContext, runtime)
    force = tagged(FORCED_FINAL, P.FORCE_ANSWER)
    cap = None if state["rounds"] < ctx.max_rounds else f"RoundCap: no answer within {ctx.max_rounds} rounds"
    try:
        prompt = render_prompt(ctx, state["graphs"], [*state["messages"], force], native=state["native"])
        llm = get_llm(ctx, ROLE, reply=None if state["native"] else answer_reply(ROLE, ctx.think))
        text = ask(llm, prompt, stop=None if state["native"] else P.STOP)
    except ModelError as exc:
        return {"messages": [force], "error": f"ModelError: {exc}"}
    reply = parse_reply(text)
    answer = reply.answer or ("" if reply.calls else clean_answer(final_answer(reply.kept)))
    error = cap
    if not reply.answer:
        error = f"MalformedOutput: no <answer> in the forced final reply after {state['rounds']} rounds"
    return {"messages": [force, AIMessage(reply.kept)], "answer": answer, "error": error,
            "invented_results": state["invented_results"] + reply.invented}


# -- routing -------------------------------------------------------------------------------
def _after_start(state: OmneState, runtime: Runtime[OmneContext]) -> str:
    if state["error"]:
        return END
    if context_as(OmneContext, runtime).max_rounds <= 0:
        return "final"
    return "tools" if isinstance(state["messages"][-1], AIMessage) else "agent"


def _after_agent(state: OmneState, runtime: Runtime[OmneContext]) -> str:
    if state["error"]:
        return END
    if state["answer"]:
        return "finish"
    ctx = context_as(OmneContext, runtime)
    last = state["messages"][-1]
    if isinstance(last, AIMessage) and (last.tool_calls or last.invalid_tool_calls):
        return "tools"
    if isinstance(last, HumanMessage) and state["rounds"] < ctx.max_rounds:
        return "agent"  # after the nudge
    return "final"


def _after_tools(state: OmneState, runtime: Runtime[OmneContext]) -> str:
    ctx = context_as(OmneContext, runtime)
    if state["rounds"] >= ctx.max_rounds or not room_for_a_round(ctx, state["graphs"], state["messages"]):
        return "final"
    return "agent"


def build(checkpointer: Any = None) -> CompiledStateGraph:
    g = StateGraph(OmneState, context_schema=OmneContext, input_schema=OmneInput, output_schema=OmneOutput)
    g.add_node("start", start)
    g.add_node("agent", agent)
    g.add_node("tools", tools)
    g.add_node("final", final)
    g.add_node("finish", finish)
    g.add_edge(START, "start")
    g.add_conditional_edges("start", _after_start, ["agent", "tools", "final", END])
    g.add_conditional_edges("agent", _after_agent, ["tools", "agent", "final", "finish", END])
    g.add_conditional_edges("tools", _after_tools, ["agent", "final"])
    g.add_edge("final", "finish")
    g.add_edge("finish", END)
    return g.compile(checkpointer=checkpointer)


graph = build()
