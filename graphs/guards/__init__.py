"""Guards: rules that exist for a small model's sake, kept apart from the papers' mechanisms.

This package is the layer's registry: each guard's name, stage and switches, and the verbs that run a rule under
them (`apply`, `check`, `first_that_fires`). It stands below the designs and imports none of them
(tests/test_layout.py): a design's guards carry their rules in its own package, one entry point per stage
(`opera/guard_rules.py`; `mujica/guard_rules.py` and Mujica's conclusion step, `mujica/conclusion.py`;
`omne/guard_rules.py`). The conclusion guards OPERA and Mujica share are `option_guards.py`; the answer predicates
the rules test (refusals, grounding, comparisons) are pure functions of text in `answers.py`.

Each guard has a name, the stage it acts at and the agents that have it. Two settings pick them:
`guards` ("auto": the agent's default set, `defaults(agent)`; "none"; a comma-separated list of names;
"-name,..." for the default set without those, "+name,..." for it with those) and `guard_mode`
("enforce": a firing changes the run; "log": it is only recorded). Every firing goes to the run's `guards`
list (stage, guard, before, after, enforced), which traces, `mhqa eval` summaries and `bench/agents.py`
read. A guard that raises is recorded with its error and skipped: the run goes on as if it had not fired.

Structural validation is not a guard and is always on: reply schemas, ids, dependency cycles, caps,
repeated calls, stop sequences. Also outside the layer, being wording rather than rules that act on a reply:
relation synonyms in the prompts (Mujica's graph worker, OPERA's analysis), the stem table that ranks a
node's facts by the question's words (`tools.stems`), and the refusal words by which Mujica's planner's
"answer" beside new sub-questions is ignored and a "no answer" conclusion is not re-asked as a sentence.

Five rules that change the control flow sit outside the layer, each by decision:
- Mujica's straight dispatch (`after_wave`: a wave that all answered sends the dependents the planner already
  wrote without a planner call) is a setting, `straight_dispatch`: a cost choice, not a repair of a reply.
- Mujica's question sent to a worker (a round before `min_worker_rounds` waves that gives the workers nothing)
  is structural: it follows from the `min_worker_rounds` setting (0 turns it off), whatever the reply said.
- OPERA's query for a sub-goal whose placeholder has no answer (the sub-goal with the question beside it) is
  structural: a search needs text, and the unfilled placeholder is noted as a warning.
- OPERA's fallbacks (the question as the one sub-goal when no plan can be read; the last sub-goal's answer when
  no synthesis comes) are structural validation of malformed output, each noted as a typed error.
- Omne's one nudge or send-back a run (a shared counter) is structural: it bounds the loop; the send-backs it
  counts are guards (`send_back_ungrounded`, `send_back_one_hop`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from mhqa_graph.errors import InvalidInput

T = TypeVar("T")
MAX_SHOWN = 300  # characters of a before/after value kept in a firing


@dataclass(frozen=True)
class Guard:
    name: str
    stage: str  # plan | analysis | worker answer | conclusion | tool answer
    agents: tuple[str, ...]
    does: str  # one line: what it changes when it fires
    replaces_answer: bool = False  # it rewrites the model's final answer (a training target it touched is dropped)
    prompt_only: bool = False  # it only adds a hint to a prompt: the reply stays the model's own
    default: tuple[str, ...] | None = None  # the agents it is on for by default (None: all of `agents`); the
    # ablation on fresh questions (docs/benchmarks.md) decides: an answer-replacing guard is on only where it paid

    @property
    def on_by_default(self) -> tuple[str, ...]:
        return self.agents if self.default is None else self.default


# the guards, as objects the designs hold: a misspelt name fails at import
PLAN_RUNAWAY_CUT = Guard("plan_runaway_cut", "plan", ("opera",),
    "a plan cut off by the token limit that repeats one sub-goal is cut before the repeats")
ANALYSIS_REFUSAL = Guard("analysis_refusal", "analysis", ("opera",),
    "an analysis answer that says there is none ('unknown', 'the passages do not mention') is no answer")
ANALYSIS_GROUNDED = Guard("analysis_grounded", "analysis", ("opera",),
    "a short analysis answer that no shown passage contains is marked insufficient (a rewrite follows)")
OPTIONS_LINE = Guard("options_line", "conclusion", ("opera",),
    "the synthesis of an 'X or Y?' question is told to answer with one of the two", prompt_only=True)
UNECHO = Guard("unecho", "plan", ("mujica",),
    "what the planner copied from the progress lines ('q1: ', '(after q1)', '-> answer') is cut")
PLAN_OFF_TOPIC = Guard("plan_off_topic", "plan", ("mujica",),
    "a sub-question sharing no word stem with the question or an answer so far is dropped",
    default=())
PLAN_MADE_UP_ENTITY = Guard("plan_made_up_entity", "plan", ("mujica",),
    "with topic entities, a root sub-question naming none of them and no answer so far is dropped")
PLAN_UNANCHORED = Guard("plan_unanchored", "plan", ("mujica",),
    "a plan whose sub-question uses no earlier answer and names nothing the question names is sent back once a "
    "round, with the question's names", default=())
PLAN_EXAMPLE_COPY = Guard("plan_example_copy", "plan", ("mujica",),
    "a sub-question copying the prompt's examples or naming an entity of them is dropped")
UNKNOWN_CONTEXTS = Guard("unknown_contexts", "worker answer", ("mujica",),
    "a sub-question the worker could not answer is reported with the contexts it retrieved",
    prompt_only=True, default=())
WORKER_REFUSAL = Guard("worker_refusal", "worker answer", ("mujica",),
    "a worker answer that says there is none in other words than 'unknown' counts as unknown")
NO_ANSWER_FALLBACK = Guard("no_answer_fallback", "conclusion", ("mujica",),
    "a conclusion that says there is no answer becomes a worker's answer to the question itself",
    replaces_answer=True, default=())
SHORT_ANSWER_REASK = Guard("short_answer_reask", "conclusion", ("mujica",),
    "a conclusion that reads as a sentence and is no worker's answer is asked for again, short",
    default=())
DATE_COMPARISON = Guard("date_comparison", "conclusion", ("opera", "mujica"),
    "an 'X or Y, which came first?' answer is replaced by the option the found dates pick",
    replaces_answer=True, default=("mujica",))
OPTION_ANSWER = Guard("option_answer", "conclusion", ("opera", "mujica"),
    "an answer naming what a step found about one option (its director) becomes that option",
    replaces_answer=True, default=("mujica",))
CONCLUSION_BRIDGE = Guard("conclusion_bridge", "conclusion", ("mujica",),
    "a conclusion that cites no sub-question and repeats the answer another sub-question builds on is sent back "
    "once", default=())
CONCLUSION_UNGROUNDED = Guard("conclusion_ungrounded", "conclusion", ("mujica",),
    "a conclusion that cites no sub-question and is no worker's answer (nor yes, no or an option of the question) is "
    "sent back once, with the answers", default=())
SEND_BACK_UNGROUNDED = Guard("send_back_ungrounded", "tool answer", ("omne",),
    "an answer no fact of the run contains is sent back once, with the start entity's facts")
SEND_BACK_ONE_HOP = Guard("send_back_one_hop", "tool answer", ("omne",),
    "an answer one hop short (an entity with relations the question asks about) is sent back once")

GUARDS: dict[str, Guard] = {g.name: g for g in (
    PLAN_RUNAWAY_CUT,
    ANALYSIS_REFUSAL,
    ANALYSIS_GROUNDED,
    OPTIONS_LINE,
    UNECHO,
    PLAN_OFF_TOPIC,
    PLAN_MADE_UP_ENTITY,
    PLAN_UNANCHORED,
    PLAN_EXAMPLE_COPY,
    UNKNOWN_CONTEXTS,
    WORKER_REFUSAL,
    NO_ANSWER_FALLBACK,
    SHORT_ANSWER_REASK,
    DATE_COMPARISON,
    OPTION_ANSWER,
    CONCLUSION_BRIDGE,
    CONCLUSION_UNGROUNDED,
    SEND_BACK_UNGROUNDED,
    SEND_BACK_ONE_HOP,
)}


def defaults(agent: str | None = None) -> frozenset[str]:
    """The default set ("auto") of `agent`, or of any agent."""
    return frozenset(n for n, g in GUARDS.items() if g.on_by_default and (agent is None or agent in g.on_by_default))

MODES = ("enforce", "log")


def selected(spec: Any, agent: str | None = None) -> frozenset[str]:
    """The guard names a `guards` setting turns on: "auto", "none", names ("unecho,option_answer"), or changes to
    `agent`'s default set ("-unecho,+date_comparison"); InvalidInput for an unknown name."""
    if spec in (None, "", "auto"):
        return defaults(agent)
    if spec == "none":
        return frozenset()
    names = [str(n).strip() for n in (spec.split(",") if isinstance(spec, str) else spec) if str(n).strip()]
    unknown = [n for n in names if n.removeprefix("-").removeprefix("+") not in GUARDS]
    if unknown:
        raise InvalidInput(f"unknown guard(s) {', '.join(map(repr, unknown))}; known: {', '.join(GUARDS)}")
    changes = [n for n in names if n[0] in "+-"]
    if not changes:
        return frozenset(names)
    if len(changes) < len(names):
        raise InvalidInput("guards: list names to turn on, or +/-names to change the default set, not both")
    return defaults(agent) - {n[1:] for n in names if n[0] == "-"} | {n[1:] for n in names if n[0] == "+"}


def check_settings(guards: Any, mode: Any) -> None:
    if not (guards is None or isinstance(guards, (str, list, tuple))):
        raise InvalidInput(f"guards must be 'auto', 'none' or a list of guard names, got {guards!r}")
    selected(guards)
    if mode not in MODES:
        raise InvalidInput(f"guard_mode must be one of {', '.join(MODES)}, got {mode!r}")


def shown(value: Any) -> Any:
    """A firing's before/after value: text cut to MAX_SHOWN characters, numbers as they are, else its text."""
    if isinstance(value, str):
        return value[:MAX_SHOWN]
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    return str(value)[:MAX_SHOWN]


def firing(guard: Guard, before: Any, after: Any, enforced: bool, error: str | None = None) -> dict[str, Any]:
    record = {"guard": guard.name, "stage": guard.stage, "before": shown(before), "after": shown(after),
              "enforced": enforced, "prompt_only": guard.prompt_only, "replaces_answer": guard.replaces_answer}
    return record | ({"error": error} if error else {})


def is_on(ctx: Any, guard: Guard) -> bool:
    """Whether `guard` runs in this context (in either mode)."""
    return guard.name in selected(getattr(ctx, "guards", "auto"), getattr(ctx, "agent", None))


def enforced(ctx: Any, guard: Guard) -> bool:
    """Whether `guard` runs and acts (on, mode enforce): where a guard decides the path ahead of its
    firing, log mode takes the path of a guard that is off."""
    return is_on(ctx, guard) and getattr(ctx, "guard_mode", "enforce") == "enforce"


def apply(ctx: Any, guard: Guard, before: T, rule: Callable[[], T | None], log: list[dict],
          shown_as: tuple[Any, Any] | None = None) -> T:
    """`guard` on `before`: `rule()` gives the guarded value, or None (or `before`) when it does not fire.
    A firing is appended to `log` (with `shown_as` as its before/after, if given); its value is returned when
    the mode is enforce, else `before`. A guard that is off, does not fire, or raises returns `before` (a raise
    is logged with its error)."""
    if not is_on(ctx, guard):
        return before
    told_before, told_after = shown_as or (before, None)
    try:
        after = rule()
    except Exception as exc:  # a guard must never stop the run
        log.append(firing(guard, told_before, None, False, f"{type(exc).__name__}: {exc}"))
        return before
    if after is None or after == before:
        return before
    enforced = getattr(ctx, "guard_mode", "enforce") == "enforce"
    log.append(firing(guard, told_before, after if shown_as is None else told_after, enforced))
    return after if enforced else before


def check(ctx: Any, guard: Guard, fires: Callable[[], bool], before: Any, after: Any, log: list[dict]) -> bool:
    """`guard` as a test: whether it fires and acts (`fires()` true and the mode enforce). A firing is
    logged with `before` / `after` saying what it does; an off guard, or one that raises, does not act."""
    return apply(ctx, guard, False, lambda: True if fires() else None, log, shown_as=(before, after))


@dataclass(frozen=True)
class Rule:
    """One link of a stage's guard chain: the guard, its test, and what a firing records it changing."""

    guard: Guard
    fires: Callable[[], bool]
    before: Any
    after: Any


def first_that_fires(ctx: Any, rules: Iterable[Rule], log: list[dict]) -> Guard | None:
    """A stage's guards in order: the first that fires ends the chain, in either mode (so a log run takes the path
    an enforce run would have, up to the acting); the guard that fired and acts, or None. Rules after the one
    that fired are not tested; one that raises is logged with its error and ends the chain too."""
    for rule in rules:
        before = len(log)
        if check(ctx, rule.guard, rule.fires, rule.before, rule.after, log):
            return rule.guard
        if len(log) > before:
            return None
    return None
