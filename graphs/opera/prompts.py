"""Prompts of OPERA's agents: Plan (Goal Planning Module), Analysis-Answer and Rewrite (Reason-Execute
Module), and the final synthesis. Written for small instruction-tuned models: one task each, JSON out."""

import json

from mhqa_graph.replies import ReplyFormat, json_schema, line_reply, text

from ..mechanisms import relation_schema
from .replies import Analysis, DirectAnalysis, Plan, RelationPlan, RelationSubgoal, Rewrite

# the agents' replies (`replies`) give the format lines below; the Plan agent's cap and entities are given per call

PLAN_SYSTEM = """You are the Plan agent of a question answering system that searches a knowledge source.
Break the question into the fewest simple sub-goals that answer it, in the order they must be solved.
Rules:
- Each sub-goal asks for exactly one fact (one entity, date, number or place) through one relation.
  A chain such as "A's mother's father's religion" gets one sub-goal per link, in the order of the chain.
- When a sub-goal needs the answer of an earlier sub-goal, write [AnswerN], where N is that sub-goal's number.
  Never use pronouns or "the previous answer" instead.
- Keep every name, date and qualifier of the question in the sub-goals that need them.
- The last sub-goal asks for what the question asks for. A question that needs one lookup gets one sub-goal.
Reply with JSON only, in this format:
""" + Plan.line() + """

Examples
Question: Where was the director of Inception born?
{"subgoals": ["Who directed Inception?", "Where was [Answer1], the director of Inception, born?"]}
Question: What is the nationality of Ada Lovelace's husband's mother?
{"subgoals": ["Who is the husband of Ada Lovelace?", "Who is the mother of [Answer1]?", "What is the nationality of [Answer2]?"]}"""  # noqa: E501

# the Plan agent's prompt with `ask_as="relation"`: a sub-goal is one relation of one entity
RELATION_PLAN_SYSTEM = """You are the Plan agent of a question answering system that searches a knowledge source.
Break the question into the fewest simple sub-goals that answer it, in the order they must be solved.
Each sub-goal asks one relation of one entity: {"entity": "<entity>", "relation": "<relation>"} is asked as
"What is the <relation> of <entity>?".
Rules:
- The entity is a name from the question, or [AnswerN] for the answer of sub-goal N.
- One relation per sub-goal. A chain such as "A's mother's father's religion" gets one sub-goal per link,
  in the order of the chain, each about the answer of the one before.
- The last sub-goal asks for what the question asks for. A question that needs one lookup gets one sub-goal.
Reply with JSON only, in this format:
""" + RelationPlan.line() + """

Examples
Question: Where was the director of Inception born?
{"subgoals": [{"entity": "Inception", "relation": "director"}, {"entity": "[Answer1]", "relation": "place of birth"}]}
Question: What is the nationality of Ada Lovelace's husband's mother?
{"subgoals": [{"entity": "Ada Lovelace", "relation": "spouse"}, {"entity": "[Answer1]", "relation": "mother"}, {"entity": "[Answer2]", "relation": "nationality"}]}"""  # noqa: E501

PLAN_USER = "{worked}Question: {question}{hint}\nJSON:"

# before the question, with the `plan_examples` setting: plans of training questions like it
PLAN_WORKED = "Plans of questions like this one:\n{examples}\n\nNow plan this one.\n"


def worked_examples(plans: list[tuple[str, list[str]]]) -> str:
    """Worked plans ([(question, sub-goals)]) written as the Plan agent's examples are."""
    return "\n".join(f"Question: {q}\n" + json.dumps({"subgoals": goals}, ensure_ascii=False) for q, goals in plans)

PLAN_HINT = "\nEntities the question is about: {entities}"

NO_SOURCE = "OPERA needs a corpus or a graph in the context"

# the search query of a sub-goal with a placeholder no earlier answer could fill
UNRESOLVED_QUERY = "{subgoal} (question: {question})"

ANALYSIS_SYSTEM = """You are the Analysis-Answer agent. You get one sub-goal of a larger question and passages
retrieved for it. Use only the passages and the earlier findings.
- Judge only the current sub-goal, not the whole question.
- "sufficient" is true only when the passages state the fact the sub-goal asks for. The passages may name
  the relation with other words than the sub-goal (spouse for husband, parents for father): match by meaning.
- "answer" is the shortest exact span that answers the sub-goal (a name, date, number or place), or "" when
  the passages do not contain it. If you are unsure, give your best guess and set "sufficient" to false."""

ANALYSIS_FORMAT_THINK = Analysis.line()
ANALYSIS_FORMAT_DIRECT = DirectAnalysis.line()  # think off: no reasoning field

ANALYSIS_USER = """Question: {question}
Earlier findings:
{findings}
Current sub-goal: {subgoal}

Retrieved passages:
{passages}

Reply with JSON only, in this format:
{format}"""

REWRITE_SYSTEM = """You are the Rewrite agent. A search did not find what a sub-goal needs. Write one new search
query that is more likely to find it: name the entities explicitly, use other words for the relation, drop
words that do not help. Reply with JSON only: """ + Rewrite.line()

REWRITE_USER = """Question: {question}
Sub-goal: {subgoal}
Queries tried so far:
{tried}
Why the last search was not enough: {reason}
Titles of the passages it found: {titles}

JSON:"""

ANSWER_SYSTEM = """You answer a question from the findings of its sub-goals. Reply with the final answer only:
a short phrase (an entity, date, number, or yes/no), no explanation, no full sentence."""

ANSWER_USER = """Question: {question}
Findings:
{findings}
Final answer:"""

# after the question, when it names two options (`answers.comparison`; the `options_line` guard)
ANSWER_OPTIONS = "\nAnswer with one of the two it names: {a} or {b}."


# -- reply formats (mhqa_graph.replies): what a constrained backend lets each role write ----------
def plan_format(max_subgoals: int, entities: list[str] | None = None, ask_as: str = "question") -> ReplyFormat:
    """The Plan agent's reply: sub-goals as text, or with `ask_as="relation"` each an entity (one of `entities`,
    the question's topic entities when given, or an earlier answer [AnswerN]) and a relation."""
    if ask_as != "relation":
        return Plan.reply("plan", subgoals={"type": "array", "items": text(), "minItems": 1, "maxItems": max_subgoals})
    refs = [f"[Answer{n}]" for n in range(1, max_subgoals)]
    item = RelationSubgoal.asked("subgoal", **relation_schema(entities, refs))
    return RelationPlan.reply("plan", subgoals={"type": "array", "items": json_schema(item), "minItems": 1,
                                                "maxItems": max_subgoals})


def plan_system(ask_as: str) -> str:
    return RELATION_PLAN_SYSTEM if ask_as == "relation" else PLAN_SYSTEM


FACT_NONE = ("", "yes", "no")  # what an analysis answer read from facts may be besides them (answer_from_facts)


def analysis_format(think: bool, answer: dict | None = None) -> ReplyFormat:
    """The analysis reply; `answer`, when given, is the schema of its answer (`answer_from_facts`)."""
    return (Analysis if think else DirectAnalysis).reply("analysis", **({"answer": answer} if answer else {}))


REWRITE_FORMAT = Rewrite.reply("rewrite")
ANSWER_FORMAT = line_reply("answer")
