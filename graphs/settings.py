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

from mhqa_graph.errors import InvalidInput, InvalidQuestion, ModelError, shown
from mhqa_graph.replies import DECODING_MODES, can_constrain
from mhqa_graph.store import KnowledgeStore
from mhqa_graph.store.base import MAX_K, MAX_NODE_FACTS

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
                       "auto = the best installed pack, through llama.cpp where llama-cpp-python is installed.")
    role_llms: dict[str, Any] = setting(default_factory=dict, help="Model spec per role, overriding llm, e.g. "
                                        "{\"plan\": \"qwen2.5-coder-1.5b\"}; keys must be the agent's roles.")
    store: Any = setting(None, help="Store URI (embedded:///abs/dir or neo4j://host:7687); "
                         "empty = $MHQA_STORE, else the user data dir. The store must exist.")
    llm_cache: str | None = setting(None, help="A call cache file (SQLite; created if missing): every model call's "
                                    "reply is kept under a key of all that decides it, and a later call with the same "
                                    "key is answered from the file. Records count those calls (llm_calls_cached).")
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
                            "(llama.cpp grammar, OpenAI-compatible json_schema, xgrammar for transformers, a chat "
                            "model's own with_structured_output), else prompt and parse; constrained: the same, but a "
                            "role whose backend constrains nothing is an error (turns a backend cannot express still "
                            "use the prompt); prompt: never constrain.")
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


# The range of each numeric setting of every agent, (least, most) in its unit: NaN, an infinity or a value outside it
# is an InvalidInput naming the setting and its range (`check_values`). A numeric setting added without a range here
# may be 0 to DEFAULT_MOST (tests/test_hardening.py checks that none is).
SETTING_RANGES: dict[str, tuple[int, int]] = {
    "top_k": (1, MAX_K), "topk_schedule": (1, MAX_K),  # a store search's k (topk_schedule: each of its entries)
    "max_rounds": (1, 100), "max_rewrites": (0, 20), "max_new_tokens": (1, 32_768), "plan_example_k": (0, 20),
    "parse_retries": (0, 10), "model_retries": (0, 20),
    "retry_backoff": (0, 600), "model_timeout": (0, 86_400),  # seconds (a day; 0 = no limit)
    "min_confidence": (0, 1), "trust_confidence": (0, 1), "budget": (0, 1000),  # auto
    "kg_nodes": (0, 100),  # rag
    "max_subquestions": (0, 100), "kg_entities": (0, 100), "max_facts": (0, MAX_NODE_FACTS),  # Mujica
    "min_worker_rounds": (0, 100), "replan_retries": (0, 20), "send_back_rounds": (0, 20),
    "planner_budget": (0, 1_000_000),
    "max_calls_per_round": (0, 100), "result_chars": (0, 1_000_000), "context_chars": (0, 1_000_000),  # Omne
}
DEFAULT_MOST = 1_000_000


def check_number(name: str, value: Any, integer: bool) -> None:
    """InvalidInput, naming `name` and its range (SETTING_RANGES), unless `value` is an integer (`integer`) or a
    number in it; NaN and the infinities are in no range."""
    least, most = SETTING_RANGES.get(name, (0, DEFAULT_MOST))
    typed = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not typed or isinstance(value, bool) or not least <= value <= most:  # NaN fails both comparisons
        kind = "an integer" if integer else "a number"
        raise InvalidInput(f"{name} must be {kind} from {least:,} to {most:,}, got {shown(value)}")


def check_values(ctx: AgentContext) -> None:
    """InvalidInput for a setting of the wrong type or out of its range (`check_number`)."""
    for f in fields(ctx):
        value = getattr(ctx, f.name)
        if f.type in ("int", int, "float", float):
            check_number(f.name, value, integer=f.type in ("int", int))
        elif f.type == "tuple[int, ...]":
            if not isinstance(value, (list, tuple)) or len(value) > 100:
                raise InvalidInput(f"{f.name} must be a list of at most 100 integers, got {shown(value)}")
            for item in value:
                check_number(f.name, item, integer=True)
        elif f.type in ("bool", bool) and not isinstance(value, bool):
            raise InvalidInput(f"{f.name} must be true or false, got {shown(value)}")
        elif f.type == "str | None" and not (value is None or isinstance(value, str)):
            raise InvalidInput(f"{f.name} must be a string, got {shown(value)}")


def validate_context(ctx: AgentContext, roles: tuple[str, ...]) -> None:
    """InvalidInput or ModelError for a setting that would fail the run, before any work: a value of the wrong type
    or out of its range (`check_values`), `role_llms` keys that are not among `roles`, a model spec that cannot
    load."""
    from mhqa_graph.models.factory import check_chat_spec, default_chat_spec

    check_values(ctx)
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
            if default_chat_spec() is None:
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
            if not can_constrain(default_chat_spec() if spec in ("", "auto", None) else spec):
                named = shown(spec) if isinstance(spec, str) or spec is None else type(spec).__name__
                raise InvalidInput(f"decoding=constrained: {where} ({named}) cannot be constrained; use a "
                                   "llamacpp: or openai: model, a chat model object with its own "
                                   "with_structured_output, or decoding=auto")
    if not (ctx.store is None or isinstance(ctx.store, (str, KnowledgeStore))):
        raise InvalidInput(f"store must be a URI or a KnowledgeStore, got {type(ctx.store).__name__}")


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
