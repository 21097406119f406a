"""Prompts of the Mujica planner/worker agent. `{placeholders}` are filled with str.format; PLANNER_SYSTEM,
WORKER_SYSTEM (passages) and GRAPH_WORKER_SYSTEM (graph facts) are sent as they are (single braces)."""

import json
import re

from mhqa_graph.replies import ReplyFormat, json_reply, json_schema

from ..mechanisms import RELATION_QUESTION, relation_schema
from .replies import Conclusion, Plan, RelationPlan, RelationSubQuestion, SubQuestion, Worker


def _braced(line: str) -> str:
    """A JSON line as literal text inside a str.format template."""
    return line.replace("{", "{{").replace("}", "}}")


# the planner's worked examples: (question, sub-questions as (question, depends_on)), and the names they use
EXAMPLES = (
    ("Where was the director of Inception born?",
     (("Who directed Inception?", ()), ("Where was #q1 born?", ("q1",)))),
    ("Which film came out first, Vertigo or Jaws?",
     (("When was Vertigo released?", ()), ("When was Jaws released?", ()))),
    ("What is the nationality of Ada Lovelace's husband's mother?",
     (("Who is the husband of Ada Lovelace?", ()), ("Who is the mother of #q1?", ("q1",)),
      ("What is the nationality of #q2?", ("q2",)))),
)
EXAMPLE_NAMES = ("Inception", "Vertigo", "Jaws", "Ada Lovelace")


def _example(question: str, plan: tuple) -> str:
    asked = [{"id": f"q{n}", "question": text, "depends_on": list(deps)} for n, (text, deps) in enumerate(plan, 1)]
    return f"Question: {question}\n" + json.dumps({"subquestions": asked})


# the same examples with each sub-question as one relation of one entity (the `ask_as="relation"` setting)
RELATION_EXAMPLES = (
    ("Where was the director of Inception born?", (("Inception", "director"), ("#q1", "place of birth"))),
    ("Which film came out first, Vertigo or Jaws?", (("Vertigo", "release date"), ("Jaws", "release date"))),
    ("What is the nationality of Ada Lovelace's husband's mother?",
     (("Ada Lovelace", "spouse"), ("#q1", "mother"), ("#q2", "nationality"))),
)
# the examples' sub-questions as a worker is asked them, in each form (what `plan_example_copy` compares with)
EXAMPLE_SUBQUESTIONS = {"question": tuple(text for _, plan in EXAMPLES for text, _ in plan),
                        "relation": tuple(RELATION_QUESTION.format(entity=e, relation=r)
                                          for _, plan in RELATION_EXAMPLES for e, r in plan)}


def _relation_example(question: str, plan: tuple) -> str:
    asked = [{"id": f"q{n}", "entity": e, "relation": r} for n, (e, r) in enumerate(plan, 1)]
    return f"Question: {question}\n" + json.dumps({"subquestions": asked})


_INTRO = """You are the planner of a question-answering team. You break a multi-hop question into \
simple sub-questions that workers answer from a knowledge source, and you write the final answer \
from their answers.

Each turn you see the workers' answers and the sub-questions asked so far. Then either:
"""
_CONCLUDE = """2. or conclude, when the workers' answers are enough:
""" + Conclusion.line(answer="<short answer: an entity, a date, a number, yes or no>") + """

Examples of a first turn:
"""
_LATER_RULES = """- A sub-question answered "unknown" or "failed" has no answer and the sub-questions that use it \
wait: ask it again with the same id in other words (about the entity its contexts name, if they name the one it \
needs), ask something else, or conclude.
- Conclude with what the workers found: a worker's answer, yes or no, or one of the two options the \
question names."""

PLANNER_SYSTEM = _INTRO + """1. ask new sub-questions, as a small graph: each has an id, a question and the ids \
it depends on. Sub-questions without dependencies run in parallel. A sub-question may use an earlier answer by \
writing its id as #q1; the worker sees the answer in its place.
""" + _CONCLUDE + "\n".join(_example(q, plan) for q, plan in EXAMPLES) + """

Rules:
- Each sub-question asks one fact through one relation. "Where was X's father buried?" is two \
sub-questions: "Who is the father of X?", then "Where was #q1 buried?".
- Copy the names and titles of the question word for word. Never write a name you guessed, or one from \
the examples.
- Ids are new and unique (q1, q2, ...); a dependency names an earlier or new id, never the sub-question \
itself, and dependencies never form a loop. Do not repeat a sub-question that was already asked.
""" + _LATER_RULES

# the system prompt of `ask_as="relation"`: a sub-question is one relation of one entity
RELATION_PLANNER_SYSTEM = _INTRO + """1. ask new sub-questions. Each asks one relation of one entity: an id, the \
entity (a name from the question, or #q1 for the answer of sub-question q1) and the relation. The worker is asked \
"What is the <relation> of <entity>?", with the answer in place of #q1. Sub-questions that use no \
earlier answer run in parallel.
""" + _CONCLUDE + "\n".join(_relation_example(q, plan) for q, plan in RELATION_EXAMPLES) + """

Rules:
- One relation per sub-question. "Where was X's father buried?" is two sub-questions: the father of X, \
then the place of burial of #q1.
- Never write a name you guessed, or one from the examples.
- Ids are new and unique (q1, q2, ...). Do not repeat a sub-question that was already asked.
""" + _LATER_RULES


# with `cite_answers`: how the system prompt's conclusion and its last rule read
CITE_CONCLUDE = """2. or conclude, when the workers' answers are enough: cite the sub-question whose answer is the \
answer to the question, as {"answer": "#q2"}, or write the answer when no single answer is it (yes or no, one of \
the two options the question names):
""" + Conclusion.line(answer="<short answer>") + """

Examples of a first turn:
"""
CITE_RULE = """- Conclude with what the workers found: cite the sub-question that answers what the question asks \
(#q2), not one that a later sub-question builds on; or write yes or no, or one of the two options the question \
names."""


def planner_system(ask_as: str, cite: bool = False) -> str:
    """The planner's system prompt: sub-questions as questions or (`ask_as="relation"`) as relations; with `cite`
    (`cite_answers`) a conclusion cites the sub-question whose answer it is."""
    system = RELATION_PLANNER_SYSTEM if ask_as == "relation" else PLANNER_SYSTEM
    if cite:
        system = system.replace(_CONCLUDE, CITE_CONCLUDE).replace(_LATER_RULES.splitlines()[-1], CITE_RULE)
    return system

# before the question in the first turn, with the `plan_examples` setting: plans of training questions like it
WORKED = "Plans of questions like this one:\n{examples}\n\nNow plan this one.\n"


def worked_examples(plans: list[tuple[str, list[str]]]) -> str:
    """Worked plans ([(question, sub-goals citing [AnswerN])]) written as the planner's examples are: sub-goal N is
    qN, and a cited [AnswerN] is #qN and a dependency."""
    def plan(goals: list[str]) -> tuple:
        return tuple((re.sub(r"\[Answer(\d+)\]", r"#q\1", g), tuple(f"q{n}" for n in
                      dict.fromkeys(re.findall(r"\[Answer(\d+)\]", g)))) for g in goals)
    return "\n".join(_example(q, plan(goals)) for q, goals in plans)


# why a plan was sent back (`replan_retries`), inside the repair message: "That reply could not be used (...)"
NOTHING_TO_RUN = ("nothing in it can run: {why}. Ask a sub-question that was not asked before, in other words or "
                  "about another entity, or conclude with " + _braced(Conclusion.line()))

# a round that planned nothing that can run, answered with a new turn (`send_back_rounds`)
SENT_BACK_USER = """Sub-questions so far:
{progress}

Your last turn asked nothing that can run: {why}. If the answers above answer the question, conclude with \
""" + _braced(Conclusion.line()) + """; else ask a sub-question that was not asked before.

Turn {round} of {max_rounds}. {think}"""
NOTHING_NEW = "it asked no new sub-question"

# why a plan was sent back (`plan_unanchored`), inside the repair message
UNANCHORED = ("{ids} {verb} no earlier answer and {names_verb} nothing the question names. Start from what the "
              "question names: write a first sub-question that contains {names}, word for word, and plan again")

# why a conclusion was sent back (`conclusion_bridge`), inside the repair message
BRIDGE = ("{answer!r} is the answer of {sid}, which {later} builds on: a step on the way, not what the question asks. "
          "{then}")
ANSWER_OR_ASK = "Conclude with the answer to the question, or ask what is missing"
ANSWER_NOW = "Conclude with the answer to the question"
UNGROUNDED = "{answer!r} is none of the workers' answers ({said}). {then}"
UNCITED = "{sid} has no answer to cite: cite a sub-question that has one, or write the answer"

THINK_FIRST = "First reason briefly inside <think>...</think>, then give the JSON."
NO_THINK = "Reply with the JSON only."
MUST_ASK = "Ask at least one sub-question before you answer. "
TOO_EARLY = "no worker has answered yet: ask at least one sub-question first"

PLANNER_USER = """{worked}Question: {question}{topic}

Sub-questions so far:
{progress}

Turn {round} of {max_rounds}. {must_ask}{think}"""

REPORT = """Worker answers:
{answers}

"""

NEXT_USER = """Sub-questions so far:
{progress}

Turn {round} of {max_rounds}. {must_ask}{think}"""

NO_MORE = "No more sub-questions can be asked."  # eval/health.py counts forced answers by it

FINAL_USER = """Sub-questions so far:
{progress}

""" + NO_MORE + " Give your best final answer now, as {conclude}. {think}"
CONCLUDE = Conclusion.line()  # FINAL_USER's {conclude}; with `cite_answers`, CITE_FINAL
CITE_FINAL = Conclusion.line(answer="#q2") + " citing the sub-question whose answer it is, or " + Conclusion.line()

# asked afresh (without the planner's conversation) when it concludes with a sentence
SHORT_USER = """Question: {question}

Sub-questions so far:
{progress}

Give only what the question asks for: the name, date or number as a worker's answer writes it, or yes or no \
to a yes-no question, as """ + _braced(Conclusion.line()) + "."
NO_NEW_ANSWERS = "(no new worker answers)"
TOPIC = "\nTopic entities: {entities}"
NO_PROGRESS = "(none yet)"
WAITING = "(not answered yet)"
BLOCKED = "(blocked: {ids} has no answer)"
UNKNOWN = "unknown (not in the worker's contexts)"
TABLE_HEAD = "| id | sub-question | answer | evidence |\n|---|---|---|---|"  # the results as `cite_answers` shows them
TABLE_EVIDENCE_CHARS = 160
SELECTED = "context"  # a context the worker selected, under its answer
RETRIEVED = "retrieved"  # a context retrieved for a sub-question the worker could not answer
FAILED = "failed (the worker gave no usable answer)"

WORKER_SYSTEM = """You answer one simple question from numbered contexts. Pick the contexts that \
help answer it and give a short answer (an entity, a date, a number, yes or no). If the contexts \
do not contain the answer, answer "unknown"."""

# the worker's system prompt when its contexts are graph facts
GRAPH_WORKER_SYSTEM = """You answer one simple question from numbered contexts. A fact from a knowledge graph \
is written (subject) -[relation]-> (object): the subject's relation is the object. The relation may be \
worded otherwise than the question: released is publication date, born is date or place of birth, \
father or mother is parents, husband or wife is spouse. Pick the contexts that help answer it and give \
a short answer (an entity, a date, a number, yes or no), writing names in full as the context does. If \
the contexts do not contain the answer, answer "unknown"."""

WORKER_USER = """Question: {question}

Contexts:
{contexts}

Reply with JSON: {format}. {think}"""

NO_CONTEXTS = "(no contexts found)"


# -- reply formats (mhqa_graph.replies): what a constrained backend lets each role write ----------
def _ids(cap: int) -> dict:
    return {"type": "string", "enum": [f"q{i}" for i in range(1, cap + 1)]}


def planner_format(final: bool, may_answer: bool, think: bool, cap: int, entities: list[str] | None = None,
                   ask_as: str = "question") -> ReplyFormat:
    """The planner's reply: sub-questions with ids among q1..q`cap` (dependencies too), or the answer when it
    may conclude; only the answer when it must. With `ask_as="relation"` a sub-question is an entity and a
    relation, the entity one of `entities` (the question's topic entities, when given) or an earlier answer
    (#q1..#q`cap`)."""
    ids, answer = _ids(cap), Conclusion.asked("planner")
    if ask_as == "relation":
        plan = RelationPlan
        item = RelationSubQuestion.asked("subquestion", id=ids,
                                         **relation_schema(entities, [f"#q{i}" for i in range(1, cap + 1)]))
    else:
        plan = Plan
        item = SubQuestion.asked("subquestion", id=ids, depends_on={"type": "array", "items": ids, "maxItems": cap})
    asks = plan.asked("planner", subquestions={"type": "array", "items": json_schema(item), "maxItems": cap})
    return json_reply("planner", answer if final else asks | answer if may_answer else asks, think=think)


def worker_format(contexts: int, think: bool, answer: dict | None = None) -> ReplyFormat:
    """The worker's reply: the numbers of the contexts it used (1..`contexts`) and its answer (of the schema
    `answer` when given: `answer_from_facts`)."""
    numbers = {"type": "integer", "enum": list(range(1, contexts + 1))} if contexts else {"type": "integer"}
    return Worker.reply("worker", think=think, relevant={"type": "array", "items": numbers, "maxItems": contexts},
                        **({"answer": answer} if answer else {}))


FACT_NONE = ("unknown", "yes", "no")  # what a worker's answer read from facts may be besides them


SHORT_FORMAT = Conclusion.reply("short answer")
