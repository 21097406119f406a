"""Two baselines for the agents: `direct` (closed book: the model answers from its own knowledge)
and `rag` (retrieve once, then answer). `rag` searches `ctx.corpus` for the question (or for its input `query`,
when given: auto's second look); with only `ctx.graph` set it matches entities for the question (or its topic
entities) and shows the facts of the best ones. With `confidence`, both also report the model's confidence in
its answer, read from its token log-probabilities (`mhqa_graph.models.logprobs`).

    direct: start -> answer
    rag:    start -> retrieve -> answer      (a store error ends the run after retrieve)

What they declare to the registry and the core: `RAG_SPEC`, `DIRECT_SPEC`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import (
    Any,
    NotRequired,  # pydantic needs these on 3.11 (Studio schemas)
)

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from typing_extensions import TypedDict

from mhqa_graph.errors import MhqaError, ModelError
from mhqa_graph.models.logprobs import answer_logprobs, confidence
from mhqa_graph.parsing import final_answer
from mhqa_graph.replies import answer_reply
from mhqa_graph.text import topic_entities
from mhqa_graph.tools import cap_text, format_passages, node_info_tool
from mhqa_graph.traces import Step, Trace, as_retrieved

from . import baselines_prompts as P
from .calls import Parsed, ask_repaired, clean_answer, get_llm, get_store
from .settings import AgentContext, QAInput, QAOutput, check_question, context_as, setting
from .spec import DesignSpec, Output, TraceParts, retrieved_something

ROLE = "answer"


@dataclass
class BaselineContext(AgentContext):
    kg_nodes: int = setting(3, help="rag over a graph: how many matched entities to show the facts of.")
    confidence: bool = setting(False, help="Report the model's confidence in its answer (`confidence`: the "
                               "probability of the answer's least likely token, before any grammar) where the "
                               "backend gives token log-probabilities (llama.cpp, OpenAI-compatible servers); "
                               "None elsewhere. The answer is the same either way.")


class RagInput(QAInput):
    query: NotRequired[str]  # what to search the corpus for (default: the question); the model is asked the question


class DirectOutput(QAOutput):
    raw: str  # the model's reply (replies, after a repair, blank-line separated)
    confidence: NotRequired[float | None]  # with the `confidence` setting: see BaselineContext
    answer_logprobs: NotRequired[list[float] | None]  # with it too: the log-probability of each token of the answer


class RagOutput(QAOutput):
    source: str  # "corpus:<name>" or "graph:<names>"
    retrieved: list[dict[str, Any]]  # passages {id, title, score} or entities {graph, entity, score}
    raw: str
    confidence: NotRequired[float | None]  # with the `confidence` setting: see BaselineContext
    answer_logprobs: NotRequired[list[float] | None]  # with it too: the log-probability of each token of the answer


class DirectState(TypedDict):
    question: str
    topic_entities: NotRequired[list[str]]
    raw: str
    answer: str
    error: str | None
    confidence: NotRequired[float | None]
    answer_logprobs: NotRequired[list[float] | None]


class RagState(DirectState):
    query: NotRequired[str]
    source: str
    retrieved: list[dict[str, Any]]
    context: str  # the retrieved text as shown to the model


def _reply(ctx: BaselineContext, system: str, user: str) -> dict:
    """Ask the answer model, its reply constrained to `<think>…</think><answer>…</answer>` where the backend
    can; a reply with no answer gets the agents' bounded repair (`parse_retries`). The state update with the
    raw replies, the answer and the error (and the answer's `confidence`, with that setting)."""
    llm = get_llm(ctx, ROLE, reply=answer_reply(ROLE, think=ctx.think), logprobs=ctx.confidence)
    messages = [SystemMessage(system.format(think=P.THINK_ON if ctx.think else P.THINK_OFF)), HumanMessage(user)]

    def read(text: str) -> str:
        if answer := clean_answer(final_answer(text)):
            return answer
        raise ValueError(P.NO_ANSWER_TAG)

    parsed = Parsed()
    try:
        ask_repaired(llm, messages, read, ctx.parse_retries, again=P.ASK_AGAIN, parsed=parsed)
    except ModelError as exc:
        return {"raw": "\n\n".join(parsed.raw), "answer": "", "error": f"ModelError: {exc}"}
    error = None if parsed.value else "MalformedOutput: the reply has no answer"
    tokens = answer_logprobs(parsed.message) if ctx.confidence and parsed.value else None
    sure = {"confidence": confidence(tokens), "answer_logprobs": tokens} if ctx.confidence else {}
    return {"raw": "\n\n".join(parsed.raw), "answer": parsed.value or "", "error": error, **sure}


def start(state: DirectState) -> dict:
    return {"question": check_question(state.get("question")), "raw": "", "answer": "", "error": None}


def direct_answer(state: DirectState, runtime: Runtime[BaselineContext]) -> dict:
    return _reply(context_as(BaselineContext, runtime), P.DIRECT_SYSTEM, P.QUESTION.format(question=state["question"]))


def _kg_facts(ctx: BaselineContext, question: str, topic_entities: list[str]) -> tuple[list[dict], str]:
    """Entities matching the topic entities (or the question) in every graph of the run, best
    `kg_nodes` overall, with their facts."""
    store = get_store(ctx)
    graphs = [g.strip() for g in ctx.graph.split(",") if g.strip()]
    best: dict[tuple[str, str], float] = {}
    for g in graphs:
        for query in topic_entities or [question]:
            for hit in store.match_entities(g, query, k=ctx.top_k):
                best[(g, hit.name)] = max(best.get((g, hit.name), float("-inf")), hit.score)
    top = sorted(best.items(), key=lambda kv: -kv[1])[:ctx.kg_nodes]
    retrieved = [{"graph": g, "entity": name, "score": score} for (g, name), score in top]
    node_info = node_info_tool(store, graphs)
    blocks = [node_info.invoke({"entity": r["entity"], "graph_type": r["graph"]}) for r in retrieved]
    return retrieved, cap_text("\n\n".join(blocks)) or "No matching entities."


def retrieve(state: RagState, runtime: Runtime[BaselineContext]) -> dict:
    ctx = context_as(BaselineContext, runtime)
    question = state["question"]
    topic = topic_entities(state.get("topic_entities"))
    try:
        if ctx.corpus:
            hits = get_store(ctx).search(ctx.corpus, state.get("query") or question, k=ctx.top_k)
            return {"source": f"corpus:{ctx.corpus}", "context": format_passages(hits),
                    "retrieved": [{"id": h.id, "title": h.title, "score": h.score} for h in hits]}
        if ctx.graph:
            retrieved, context = _kg_facts(ctx, question, topic)
            return {"source": f"graph:{ctx.graph}", "context": context, "retrieved": retrieved}
    except MhqaError as exc:
        return {"source": "", "context": "", "retrieved": [], "error": f"{type(exc).__name__}: {exc}"}
    return {"source": "", "context": "", "retrieved": [],
            "error": "NoSource: rag needs a corpus or a graph in the run context"}


def rag_answer(state: RagState, runtime: Runtime[BaselineContext]) -> dict:
    template = P.PASSAGES if state["source"].startswith("corpus:") else P.FACTS
    return _reply(context_as(BaselineContext, runtime), P.RAG_SYSTEM, template.format(context=state["context"],
                                                                    question=state["question"]))


def _after_retrieve(state: RagState) -> str:
    return END if state["error"] else "answer"


def build_direct(checkpointer: Any = None) -> CompiledStateGraph:
    g = StateGraph(DirectState, context_schema=BaselineContext, input_schema=QAInput, output_schema=DirectOutput)
    g.add_node("start", start)
    g.add_node("answer", direct_answer)
    g.add_edge(START, "start")
    g.add_edge("start", "answer")
    g.add_edge("answer", END)
    return g.compile(checkpointer=checkpointer)


def build_rag(checkpointer: Any = None) -> CompiledStateGraph:
    g = StateGraph(RagState, context_schema=BaselineContext, input_schema=RagInput, output_schema=RagOutput)
    g.add_node("start", start)
    g.add_node("retrieve", retrieve)
    g.add_node("answer", rag_answer)
    g.add_edge(START, "start")
    g.add_edge("start", "retrieve")
    g.add_conditional_edges("retrieve", _after_retrieve, ["answer", END])
    g.add_edge("answer", END)
    return g.compile(checkpointer=checkpointer)


direct_graph = build_direct()
rag_graph = build_rag()


def rag_parts(output: Output) -> TraceParts:
    """The one retrieval, as a step (none when the run ended before it)."""
    if "retrieved" not in output:
        return [], [], []
    return [], [Step(id="retrieve", kind="retrieve", query=output.get("query") or output.get("question", ""),
                     retrieved=as_retrieved(output["retrieved"]))], []


def rag_lines(output: Output, supporting_titles: Collection[str]) -> list[str]:
    """The titles (or entities) retrieved, supporting ones marked *."""
    titles = [("*" if r.get("title") in supporting_titles else "") + str(r.get("title") or r.get("entity"))
              for r in output.get("retrieved") or []]
    return [f"retrieved: {', '.join(titles)}"]


def direct_lines(output: Output, supporting_titles: Collection[str]) -> list[str]:
    """direct searches nothing."""
    return ["(no retrieval: the model's own knowledge)"]


def confidence_field(output: Output, trace: Trace) -> dict[str, Any]:
    """The model's confidence in its answer, when the run reports one (the `confidence` setting)."""
    return {"confidence": output["confidence"]} if output.get("confidence") is not None else {}


RAG_SPEC = DesignSpec(name="rag", build=build_rag, context=BaselineContext, roles=(ROLE,), min_calls=1,
                      demo_lines=rag_lines, trace_parts=rag_parts, acted=retrieved_something,
                      record_fields=confidence_field)
DIRECT_SPEC = DesignSpec(name="direct", build=build_direct, context=BaselineContext, roles=(ROLE,), min_calls=1,
                         demo_lines=direct_lines, record_fields=confidence_field, searches=False)
