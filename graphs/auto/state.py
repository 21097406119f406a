"""auto's settings, its state, and the reasons its decisions give (a code for code, a sentence for people)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any, ClassVar, Literal, NotRequired

from typing_extensions import TypedDict

from mhqa_graph.errors import InvalidInput

from ..baselines import RAG_SPEC
from ..mujica import SPEC as MUJICA_SPEC
from ..omne import SPEC as OMNE_SPEC
from ..opera import SPEC as OPERA_SPEC
from ..settings import AgentContext, QAOutput, extend, setting, validate_context

DESIGNS = ("opera", "mujica", "omne")  # what auto may escalate to
STAGES = ("rag", *DESIGNS)  # the agents auto runs as stages: the keys of `stage_settings`
STAGE_SPECS = {"rag": RAG_SPEC, "second_look": RAG_SPEC, "opera": OPERA_SPEC, "mujica": MUJICA_SPEC,
               "omne": OMNE_SPEC}  # the design each stage runs
MIN_CALLS = {stage: spec.min_calls for stage, spec in STAGE_SPECS.items()}  # the fewest calls a stage answers in

Action = Literal["stop", "look again", "escalate", "answer", "fallback"]
Reason = Literal["found_in_evidence", "sure_of_graph_answer", "no_answer", "refusal", "not_in_evidence",
                 "graph_answer_not_named", "not_of_asked_form", "unsure", "answers_agree", "answers_differ",
                 "agrees_with_rag", "rag_had_none", "differs_from_rag", "stage_failed"]
REASONS: dict[str, str] = {  # each reason's sentence; a failed stage's is its error
    "found_in_evidence": "found in its evidence",
    "sure_of_graph_answer": "a graph answer the model is sure of",
    "no_answer": "no answer",
    "refusal": "a refusal",
    "not_in_evidence": "not in its evidence",
    "graph_answer_not_named": "a graph answer the question does not name",
    "not_of_asked_form": "not of the form the question asks",
    "unsure": "the model is unsure of it",
    "answers_agree": "the two answers agree",
    "answers_differ": "the two answers differ",
    "agrees_with_rag": "agrees with rag",
    "rag_had_none": "rag had none",
    "differs_from_rag": "differs from rag",
}


class Decision(TypedDict):
    stage: str  # rag, second_look or the design's name
    action: Action
    code: Reason
    reason: str  # REASONS[code], or the error of a failed stage
    answer: str
    confidence: NotRequired[float]  # rag's, when it reports one


def decision(stage: str, action: Action, code: Reason, answer: str, error: str | None = None,
             **extra: Any) -> Decision:
    """One decision of `stage`, its sentence from REASONS (a failed stage's error, `code` stage_failed)."""
    return Decision(stage=stage, action=action, code=code, reason=error or REASONS[code], answer=answer, **extra)


def reason_code(record: dict) -> str | None:
    """A recorded decision's reason code; records written before codes existed give it by its sentence."""
    return record.get("code") or next((c for c, text in REASONS.items() if text == record.get("reason")), None)


@dataclass
class AutoContext(AgentContext):
    """auto's settings: the common ones go to every stage (roles of `role_llms` to the stage that has them, and
    a stage's own settings from `stage_settings`)."""

    agent: ClassVar[str] = "auto"

    escalate_to: str = setting("auto", help="The design asked when the first answer is not supported: opera, "
                               "mujica, omne, or auto (omne over a graph, opera over a corpus).")
    hand_over: bool = setting(False, help="Omne starts its walk from the entities rag matched that the question "
                              "names (the best match when it names none): their facts are looked up for it before "
                              "its first turn, in place of the entity_matcher and node_info turns it would spend. "
                              "Off by default: with qwen2.5-coder-1.5b it cost F1 on PQ-2H (docs/benchmarks.md).")
    form_check: bool = setting(False, help="An answer not of the form the question asks for escalates: neither of "
                               "the two options an 'X or Y?' question names, or not yes or no to a yes-no question.")
    second_look: bool = setting(False, help="On a corpus, a supported first answer is checked by a second rag call "
                                "over the passages found for the question with that answer added: the two answers "
                                "agreeing stops, differing escalates (one more call a question).")
    min_confidence: float = setting(0.5, help="A supported first answer whose confidence (the probability the "
                                    "model gave the answer's least likely token) is below this escalates; 0 = off. "
                                    "Needs a backend with token log-probabilities (llama.cpp, OpenAI-compatible "
                                    "servers); without them the rule does not apply. 0.5 was read on HotpotQA "
                                    "questions 0-59 with qwen2.5-coder-1.5b (docs/benchmarks.md).")
    trust_confidence: float = setting(0.0, help="On a graph, an answer in its facts that the question does not "
                                      "name stops when the model's confidence in it is at least this (it escalates "
                                      "otherwise, as the walk's to find); 0 = off. Log-probabilities as for "
                                      "min_confidence. Off by default: at 0.9 it cost F1 on PQ-2H with "
                                      "qwen2.5-coder-1.5b (docs/benchmarks.md).")
    budget: int = setting(12, help="Most model calls a question may take, all stages together (repairs "
                          "included); 0 = no cap. Below what the first stage and the design need, it is refused.")
    stage_settings: dict[str, dict[str, Any]] = setting(
        default_factory=dict, help="Settings of one stage, by its name (rag, opera, mujica, omne), over auto's "
        "common ones: {\"omne\": {\"max_rounds\": 5}, \"rag\": {\"top_k\": 8}}.")

    def check(self) -> None:
        check_settings(self)


class AutoOutput(QAOutput):
    answered_by: str  # the stage whose answer stands: rag or the design's name ("" when none answered)
    decisions: list[Decision]  # one or more per stage, in order
    stages: list[dict[str, Any]]  # each stage's output (the design's own fields, its calls and seconds), in order
    guards: list[dict]  # every stage's guard firings


class AutoState(TypedDict):
    question: str
    topic_entities: NotRequired[list[str]]
    answer: str
    error: str | None
    answered_by: str
    decisions: Annotated[list[Decision], extend]
    stages: Annotated[list[dict[str, Any]], extend]
    guards: Annotated[list[dict], extend]
    design: str  # the design this run escalates to (`design_for`)
    calls: int  # model calls made so far, all stages together: what the budget counts
    evidence: str  # the passages or facts rag was shown: what the judge finds its answer in
    failure: str | None  # the error that stopped rag's stage, if one did: the judge escalates on it


def design_for(ctx: AgentContext) -> str:
    """The design auto escalates to under these settings."""
    choice = getattr(ctx, "escalate_to", "auto")
    if choice != "auto":
        return choice
    return "omne" if ctx.graph else "opera"


def looks_again(ctx: AutoContext) -> bool:
    """Whether a supported first answer is looked at again (`second_look`, on a corpus)."""
    return ctx.second_look and bool(ctx.corpus)


def later_stages(ctx: AutoContext, stage: str) -> list[str]:
    """The stages that may still run after `stage`, at most."""
    after_rag = [*(["second_look"] if looks_again(ctx) else []), design_for(ctx)]
    return {"start": ["rag", *after_rag], "rag": after_rag, "second_look": [design_for(ctx)]}.get(stage, [])


def calls_left(ctx: AutoContext, made: int, stage: str) -> int:
    """The model calls `stage` may make (0 = no cap): what the budget leaves after the `made` calls and the fewest
    that the stages after it need, at least one."""
    if not ctx.budget:
        return 0
    return max(1, ctx.budget - made - sum(MIN_CALLS[s] for s in later_stages(ctx, stage)))


def check_settings(ctx: AutoContext) -> None:
    """InvalidInput, in one line, for an unknown design, a design the sources cannot serve, a budget below what the
    stages need, or a stage setting its stage does not have. (No source at all is `make_context`'s to refuse, and
    the run's, when it starts from a context made without it.)"""
    for name in ("min_confidence", "trust_confidence"):
        if not 0.0 <= getattr(ctx, name) <= 1.0:
            raise InvalidInput(f"{name} is a probability, from 0 (off) to 1; got {getattr(ctx, name)}")
    if ctx.escalate_to not in ("auto", *DESIGNS):
        raise InvalidInput(f"escalate_to must be auto or one of {', '.join(DESIGNS)}, got {ctx.escalate_to!r}")
    design = design_for(ctx)
    if design == "omne" and ctx.corpus and not ctx.graph:
        raise InvalidInput("escalate_to=omne needs a graph (set graph=), or choose opera or mujica")
    need = sum(MIN_CALLS[s] for s in later_stages(ctx, "start"))
    if ctx.budget and ctx.budget < need:
        raise InvalidInput(f"budget {ctx.budget} is below the {need} calls auto needs (rag {MIN_CALLS['rag']}"
                           f"{' twice' if looks_again(ctx) else ''}, {design} {MIN_CALLS[design]}); give at least "
                           f"{need}, or 0 for no cap")
    check_stage_settings(ctx)


def check_stage_settings(ctx: AutoContext) -> None:
    """InvalidInput for `stage_settings` that name no stage, are not a mapping, or that the stage refuses."""
    if not isinstance(ctx.stage_settings, dict):
        raise InvalidInput(f"stage_settings must map stage names to settings, got {type(ctx.stage_settings).__name__}")
    for stage, own in ctx.stage_settings.items():
        if stage not in STAGES:
            raise InvalidInput(f"stage_settings has no stage {stage!r}; auto's stages: {', '.join(STAGES)}")
        if not isinstance(own, dict):
            raise InvalidInput(f"stage_settings[{stage!r}] must be a mapping of settings, got {type(own).__name__}")
        if "role_llms" in own:
            raise InvalidInput(f"stage_settings[{stage!r}]: give a stage's models in auto's role_llms")
        validate_context(stage_context(ctx, stage), STAGE_SPECS[stage].roles)


def stage_context(ctx: AutoContext, agent: str) -> Any:
    """The context of the stage `agent`: auto's common settings, the `role_llms` of its roles, its own
    `stage_settings` (`rag` reports its confidence when `min_confidence` or `trust_confidence` is set)."""
    spec = STAGE_SPECS[agent]
    common = {f.name: getattr(ctx, f.name) for f in fields(AgentContext)}
    common["role_llms"] = {r: m for r, m in ctx.role_llms.items() if r in spec.roles}
    own = {"confidence": True} if agent == "rag" and (ctx.min_confidence or ctx.trust_confidence) else {}
    return spec.context(**(common | own | (ctx.stage_settings or {}).get(agent, {})))
