"""Run traces shared by every agent: the question, the plan or DAG, each sub-step with its query and
retrieved items, tool calls, every LLM call as chat messages with the role that made it, tokens, latency
and the answer.

A `TraceRecorder` is a LangChain callback handler: pass it in `config={"callbacks": [recorder]}` and it
sees every chat-model call (the role comes from the tags `get_llm` attaches) and tool call of the run,
from any thread; the design-specific parts (plan, steps, retrieved ids) are read from the final state by the
agent's design spec (`trace_parts`).

    recorder = TraceRecorder("opera", context)
    output = graph.invoke({"question": "Where was ...?"}, context=context, config={"callbacks": [recorder]})
    trace = recorder.trace(output)  # one recorder per run

    output, trace = run_with_trace(graph, "opera", "Where was ...?", context)  # the same in one call
    trace.model_dump_json()  # the `trace` field of an eval record

A trace keeps at most MAX_TRACE_TEXT characters of any one text (a prompt message, a reply, a state field): a
longer one is cut there and marked, and `clipped_chars` counts what was cut, per LLM call and in all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any, Literal
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import LLMResult
from pydantic import BaseModel, Field

from .designs import spec_of
from .errors import MhqaError
from .messages import kind_of
from .models.call_cache import FROM_CACHE
from .redaction import redact
from .text import encodable, map_strings, topic_entities

SCHEMA_VERSION = 1
MAX_TRACE_TEXT = 50_000  # characters kept of one text; normal prompts and replies are far shorter
CLIPPED = " [... {n} characters not kept]"
ROLE_TAG = "mhqa:role:"
_COMMON_KEYS = {"question", "topic_entities", "answer", "error", "messages"}


class TraceError(MhqaError):
    """A trace (or an eval record's `trace` field) cannot be read or lacks what is asked of it."""


# -- schema ----------------------------------------------------------------------------------
class ChatMessage(BaseModel):
    role: str  # system | user | assistant | tool
    content: str
    kind: str | None = None  # repair | nudge | send_back | forced (mhqa_graph.messages), for a tagged message


class LLMCall(BaseModel):
    """One chat-model call: the input messages, the reply, and the agent role that asked."""

    role: str  # plan | analysis | rewrite | answer | planner | worker | tool-agent | unknown
    node: str | None = None  # the LangGraph node that made the call
    messages: list[ChatMessage]
    output: str = ""
    error: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens a cache held, so not prefilled (usage input_token_details.cache_read)
    truncated_tokens: int = 0  # prompt tokens the model cut to fit its context window
    clipped_chars: int = 0  # characters of its messages and reply the trace did not keep (MAX_TRACE_TEXT)
    decoding: str = "prompt"  # grammar | json_schema (the reply was constrained to its format) | prompt
    decoding_error: str | None = None  # why a constraint was dropped (a grammar llama.cpp rejected, a 400)
    cache_error: str | None = None  # why a cached prompt state was not used (the prompt was prefilled in full)
    from_cache: bool = False  # the call cache (`llm_cache`) gave the reply: no model ran
    start: float = 0.0  # seconds since the run started
    latency: float = 0.0  # seconds


class ToolCall(BaseModel):
    name: str
    args: dict[str, Any] | str = Field(default_factory=dict)
    output: str = ""
    error: str | None = None
    node: str | None = None
    latency: float = 0.0


class Retrieved(BaseModel):
    id: str  # passage id, entity name or fact line
    score: float | None = None
    title: str | None = None


class PlanItem(BaseModel):
    id: str
    question: str
    depends_on: list[str] = Field(default_factory=list)


class Step(BaseModel):
    """One retrieval step: an OPERA attempt ("2.1" = sub-goal 2, attempt 1), a Mujica sub-question,
    the rag retrieval, or an Omne tool call."""

    id: str
    kind: str  # attempt | subquestion | retrieve | tool
    question: str = ""  # the sub-goal or sub-question as planned
    query: str = ""  # what was searched
    retrieved: list[Retrieved] = Field(default_factory=list)
    answer: str = ""
    error: str | None = None


class Trace(BaseModel):
    schema_version: int = SCHEMA_VERSION
    source: Literal["callbacks", "state"] = "callbacks"  # "state": rebuilt from a run state, no LLM calls
    agent: str
    question: str
    topic_entities: list[str] = Field(default_factory=list)
    corpus: str | None = None
    graph: str | None = None
    answer: str = ""
    error: str | None = None
    plan: list[PlanItem] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    llm_calls: list[LLMCall] = Field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # of input_tokens, not prefilled
    latency: float = 0.0  # seconds, whole run
    design: dict[str, Any] = Field(default_factory=dict)  # the agent's own final-state fields, as JSON
    clipped_chars: int = 0  # characters the trace did not keep, LLM calls included (MAX_TRACE_TEXT)
    kinds: bool = False  # its messages say their kind (mhqa_graph.messages); older traces are read by their text

    def usage(self) -> dict[str, Any]:
        """LLM calls and tokens, as the eval records count them."""
        return {"llm_calls": len(self.llm_calls), "llm_calls_cached": sum(c.from_cache for c in self.llm_calls),
                "tokens": {
            "input": self.input_tokens, "output": self.output_tokens, "total": self.input_tokens + self.output_tokens,
            "cached": self.cached_tokens}}


# -- reading final states ----------------------------------------------------------------------
def jsonable(value: Any) -> Any:
    """`value` as plain JSON data: messages and pydantic models become dicts, unknown objects repr()."""
    if isinstance(value, BaseModel):
        return jsonable(value.model_dump(exclude_none=True))
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def as_retrieved(items: list[dict] | None) -> list[Retrieved]:
    """Retrieved items from a state's hits: passages {id, title, score} or entities {entity, score}."""
    return [Retrieved(id=str(h.get("id", h.get("entity", ""))), score=h.get("score"), title=h.get("title"))
            for h in items or [] if isinstance(h, dict)]


def plan_and_steps(state: Mapping[str, Any], agent: str) -> tuple[list[PlanItem], list[Step], list[ToolCall]]:
    """The plan, the retrieval steps and the tool calls a final state of `agent` shows, as its design's spec reads
    them (`trace_parts`); none for an agent no design declares."""
    spec = spec_of(agent)
    return spec.trace_parts(state) if spec else ([], [], [])


def trace_from_state(state: Mapping[str, Any], agent: str = "unknown", question: str | None = None,
                     **settings: Any) -> Trace:
    """A trace rebuilt from a final run state or graph output alone (e.g. an eval record's output, an old
    `mhqa ask --trace` file): question, answer, plan, steps and tool calls, but no LLM calls. A graph
    output has no question: pass it."""
    if not isinstance(state, Mapping):
        raise TraceError(f"not a run state: expected an object, got {type(state).__name__}")
    question = state.get("question", question)
    if not isinstance(question, str):
        raise TraceError("not a run state: no string 'question' (pass the question of a graph output)")
    plan, steps, tool_calls = plan_and_steps(state, agent)
    return Trace(source="state", agent=agent, question=question,
                 topic_entities=topic_entities(state.get("topic_entities")), answer=state.get("answer") or "",
                 error=state.get("error"), plan=plan, steps=steps, tool_calls=tool_calls,
                 design=jsonable({k: v for k, v in state.items() if k not in _COMMON_KEYS}), **settings)


def load_trace(value: Any, agent: str = "unknown", question: str | None = None) -> Trace:
    """A Trace from a record's `trace` field: a dumped Trace (dict or JSON text), or a plain run state
    or graph output (rebuilt by `trace_from_state`)."""
    if isinstance(value, str):
        try:
            return Trace.model_validate_json(value)
        except ValueError as exc:
            raise TraceError(f"unreadable trace: {exc}") from exc
    if isinstance(value, Mapping) and "schema_version" in value:
        if value["schema_version"] != SCHEMA_VERSION:
            raise TraceError(f"trace schema version {value['schema_version']}; this version reads {SCHEMA_VERSION}")
        try:
            return Trace.model_validate(value)
        except ValueError as exc:
            raise TraceError(f"malformed trace: {exc}") from exc
    return trace_from_state(value, agent=agent, question=question)


# -- recording ---------------------------------------------------------------------------------
_SPEAKER = {SystemMessage: "system", HumanMessage: "user", AIMessage: "assistant", ToolMessage: "tool"}


def chat_message(message: BaseMessage) -> ChatMessage:
    role = next((r for cls, r in _SPEAKER.items() if isinstance(message, cls)), message.type)
    # a plain str without lone surrogates: pydantic refuses the str subclass `text` holding one
    return ChatMessage(role=role, content=encodable(message.text), kind=kind_of(message))


def _role(tags: list[str] | None, metadata: dict[str, Any] | None) -> str:
    if metadata and metadata.get("mhqa_role"):
        return str(metadata["mhqa_role"])
    return next((t[len(ROLE_TAG):] for t in tags or [] if t.startswith(ROLE_TAG)), "unknown")


def _usage(response: LLMResult) -> tuple[str, int, int, int, int]:
    """The reply text, its input/output token counts (usage metadata, else the provider's llm_output), the
    prompt tokens a cache held and the prompt tokens cut to fit the context window."""
    gen = response.generations[0][0] if response.generations and response.generations[0] else None
    text, n_in, n_out, cached, cut = (gen.text if gen else ""), 0, 0, 0, 0
    message = getattr(gen, "message", None)
    if isinstance(message, AIMessage):
        text, cut = message.text, int(message.response_metadata.get("truncated_tokens") or 0)
        if message.usage_metadata:
            n_in, n_out = message.usage_metadata["input_tokens"], message.usage_metadata["output_tokens"]
            cached = int((message.usage_metadata.get("input_token_details") or {}).get("cache_read") or 0)
    if not (n_in or n_out):
        usage = (response.llm_output or {}).get("token_usage") or {}
        n_in, n_out = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return text, n_in, n_out, cached, cut


class TraceRecorder(BaseCallbackHandler):
    """Collects the LLM and tool calls of one run, from any thread; `trace(final_state)` builds the Trace.
    Use one recorder per run."""

    run_inline = True  # called in the run's own thread or event loop, so call order is kept

    def __init__(self, agent: str, context: Any = None) -> None:
        self.agent = agent
        self.context = context
        self.t0 = time.monotonic()
        self.calls: list[LLMCall] = []
        self.tools: list[ToolCall] = []
        self.inputs: dict[str, Any] = {}
        self.outputs: dict[str, Any] | None = None
        self._pending: dict[UUID, tuple[LLMCall | ToolCall, float]] = {}
        self._root: UUID | None = None
        self._lock = threading.Lock()

    # chat models
    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *, run_id: UUID,
                            tags: list[str] | None = None, metadata: dict[str, Any] | None = None,
                            **kwargs: Any) -> None:
        self._start_llm(run_id, [chat_message(m) for m in messages[0]], tags, metadata)

    def on_llm_start(self, serialized: dict[str, Any], prompts: list[str], *, run_id: UUID,
                     tags: list[str] | None = None, metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._start_llm(run_id, [ChatMessage(role="user", content=prompts[0])], tags, metadata)

    def _start_llm(self, run_id: UUID, messages: list[ChatMessage], tags: list[str] | None,
                   metadata: dict[str, Any] | None) -> None:
        now = time.monotonic()
        meta = metadata or {}
        fallback = meta.get("mhqa_decoding_fallback")
        call = LLMCall(role=_role(tags, metadata), node=meta.get("langgraph_node"), messages=messages,
                       decoding="prompt" if fallback else str(meta.get("mhqa_decoding") or "prompt"),
                       decoding_error=fallback, start=round(now - self.t0, 6))
        with self._lock:
            self._pending[run_id] = (call, now)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        output, n_in, n_out, cached, cut = _usage(response)
        gen = response.generations[0][0] if response.generations and response.generations[0] else None
        said = getattr(getattr(gen, "message", None), "response_metadata", {})
        extra = {"decoding": said["decoding"]} if said.get("decoding") else {}  # what the backend did
        if said.get("decoding_error"):  # a grammar it rejected
            extra["decoding_error"] = str(said["decoding_error"])
        if said.get("cache_error"):  # a cached state the backend refused
            extra["cache_error"] = str(said["cache_error"])
        if said.get(FROM_CACHE):
            extra["from_cache"] = True
        self._finish(run_id, output=output, input_tokens=n_in, output_tokens=n_out, cached_tokens=cached,
                     truncated_tokens=cut, **extra)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._finish(run_id, error=redact(f"{type(error).__name__}: {error}"))  # a server may echo the key

    # tools
    def on_tool_start(self, serialized: dict[str, Any], input_str: str, *, run_id: UUID,
                      metadata: dict[str, Any] | None = None, inputs: dict[str, Any] | None = None,
                      **kwargs: Any) -> None:
        call = ToolCall(name=str((serialized or {}).get("name") or kwargs.get("name") or ""),
                        args=jsonable(inputs) if inputs is not None else input_str,
                        node=(metadata or {}).get("langgraph_node"))
        with self._lock:
            self._pending[run_id] = (call, time.monotonic())

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._finish(run_id, output=output.text if isinstance(output, BaseMessage) else str(output))

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._finish(run_id, error=redact(f"{type(error).__name__}: {error}"))

    # the graph run itself: its input and final output
    def on_chain_start(self, serialized: dict[str, Any], inputs: dict[str, Any], *, run_id: UUID,
                       parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        if parent_run_id is None and self._root is None:
            self._root, self.inputs = run_id, dict(inputs) if isinstance(inputs, Mapping) else {}

    def on_chain_end(self, outputs: dict[str, Any], *, run_id: UUID, **kwargs: Any) -> None:
        if run_id == self._root and isinstance(outputs, Mapping):
            self.outputs = dict(outputs)

    def _finish(self, run_id: UUID, **result: Any) -> None:
        """Complete a pending call with `result` and its latency; a run this recorder did not see start is ignored."""
        with self._lock:
            entry = self._pending.pop(run_id, None)
            if entry is None:
                return
            call, started = entry
            for key, value in result.items():
                setattr(call, key, value)
            call.latency = round(time.monotonic() - started, 6)
            (self.calls if isinstance(call, LLMCall) else self.tools).append(call)

    def trace(self, final_state: Mapping[str, Any] | None = None, error: str | None = None) -> Trace:
        """The Trace of the run; `final_state` defaults to the graph's output seen by the callbacks.
        `error` records a failure that ended the run (e.g. InvalidQuestion) when there is no state."""
        state = dict(final_state if final_state is not None else self.outputs or {})
        plan, steps, state_tools = plan_and_steps(state, self.agent)
        with self._lock:
            calls = sorted(self.calls, key=lambda c: c.start)
            tools = list(self.tools)
        ctx = self.context
        get = (lambda k: ctx.get(k)) if isinstance(ctx, Mapping) else (lambda k: getattr(ctx, k, None))
        entities = state.get("topic_entities") or self.inputs.get("topic_entities")
        trace = Trace(agent=self.agent, kinds=True,
                      question=str(state.get("question") or self.inputs.get("question") or ""),
                      topic_entities=topic_entities(entities),
                      corpus=get("corpus"), graph=get("graph"), answer=state.get("answer") or "",
                      error=redact(state.get("error") or error), plan=plan, steps=steps,
                      tool_calls=tools or state_tools,
                      llm_calls=calls, input_tokens=sum(c.input_tokens for c in calls),
                      output_tokens=sum(c.output_tokens for c in calls),
                      cached_tokens=sum(c.cached_tokens for c in calls), latency=round(time.monotonic() - self.t0, 6),
                      design=jsonable({k: v for k, v in state.items() if k not in _COMMON_KEYS}))
        data = trace.model_dump()
        calls = [call | {"clipped_chars": cut} for call, cut in map(kept, data.pop("llm_calls"))]
        data, cut = kept(data)
        return Trace.model_validate(data | {"llm_calls": calls,
                                            "clipped_chars": cut + sum(c["clipped_chars"] for c in calls)})


def kept(value: Any) -> tuple[Any, int]:
    """`value` as a trace keeps it, and the characters it did not keep: every string with lone surrogates as
    U+FFFD (JSON and files take none), and cut to MAX_TRACE_TEXT characters and marked when longer."""
    cut = 0

    def keep(text: str) -> str:
        nonlocal cut
        text = encodable(text)
        if len(text) <= MAX_TRACE_TEXT:
            return text
        cut += len(text) - MAX_TRACE_TEXT
        return text[:MAX_TRACE_TEXT] + CLIPPED.format(n=len(text) - MAX_TRACE_TEXT)

    return map_strings(value, keep), cut


def _config(recorder: TraceRecorder, config: dict[str, Any] | None) -> dict[str, Any]:
    config = dict(config or {})
    config["callbacks"] = [*(config.get("callbacks") or []), recorder]
    return config


def _inputs(question: str, topic_entities: list[str] | None) -> dict[str, Any]:
    return {"question": question, **({"topic_entities": topic_entities} if topic_entities else {})}


def run_with_trace(graph: Any, agent: str, question: str, context: Any, topic_entities: list[str] | None = None,
                   config: dict[str, Any] | None = None) -> tuple[dict[str, Any], Trace]:
    """Run `graph` on one question; returns the tuple (output, trace): the graph's output dict and its Trace
    (write it with `trace.model_dump_json()`; `mhqa export` reads such a file). Exceptions propagate."""
    recorder = TraceRecorder(agent, context)
    output = graph.invoke(_inputs(question, topic_entities), context=context, config=_config(recorder, config))
    return output, recorder.trace(output)


async def arun_with_trace(graph: Any, agent: str, question: str, context: Any,
                          topic_entities: list[str] | None = None,
                          config: dict[str, Any] | None = None) -> tuple[dict[str, Any], Trace]:
    """`run_with_trace` for asyncio."""
    recorder = TraceRecorder(agent, context)
    output = await graph.ainvoke(_inputs(question, topic_entities), context=context,
                                 config=_config(recorder, config))
    return output, recorder.trace(output)
