"""What every agent graph is run with: its input and output schemas, the run context (`AgentContext`, each
setting with its help) and the checks of a context and a question before any work."""

from __future__ import annotations

import unicodedata
from dataclasses import MISSING, dataclass, field, fields
from difflib import get_close_matches
from typing import (
    Any,
    ClassVar,
    Literal,
    NotRequired,  # pydantic needs these on Python 3.11
    TypeVar,
)

from langchain_core.language_models import BaseChatModel
from typing_extensions import TypedDict

from mhqa_graph.errors import InvalidInput, InvalidQuestion, ModelError
from mhqa_graph.replies import DECODING_MODES, can_constrain
from mhqa_graph.store import KnowledgeStore

from .guards import check_settings as check_guards

MAX_QUESTION_CHARS = 4000
MAX_ANSWER_CHARS = 500


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
