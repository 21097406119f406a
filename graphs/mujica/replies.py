"""The replies of Mujica's agents, one model each: the planner's turn asks sub-questions (`Plan`, each a
`SubQuestion`, or with `ask_as="relation"` a `RelationPlan` of `RelationSubQuestion`s) or concludes (`Conclusion`),
and a worker answers one sub-question (`Worker`). A field's description is how the prompt's format line shows it
(`Reply.line`)."""

from __future__ import annotations

from pydantic import Field

from mhqa_graph.replies import ANSWER_CHARS, TEXT_CHARS, Reply

from ..mechanisms import RELATION_CHARS


class SubQuestion(Reply):
    """A sub-question: its id, its text (citing an earlier answer as #q1) and the ids it waits for."""

    id: str = Field(description="q1")
    question: str = Field(min_length=1, max_length=TEXT_CHARS, description="<sub-question>")
    depends_on: list[str] = Field(description="[<ids>]")


class RelationSubQuestion(Reply):
    """A sub-question written as one relation of one entity (a name, or #q1 for an earlier answer)."""

    id: str = Field(description="q1")
    entity: str = Field(min_length=1, max_length=ANSWER_CHARS, description="<entity>")
    relation: str = Field(min_length=1, max_length=RELATION_CHARS, description="<relation>")


class Plan(Reply):
    """The planner's turn that asks new sub-questions."""

    subquestions: list[SubQuestion] = Field(description="[<sub-questions>]")


class RelationPlan(Reply):
    """The planner's turn that asks new sub-questions, with `ask_as="relation"`."""

    subquestions: list[RelationSubQuestion] = Field(description="[<sub-questions>]")


class Conclusion(Reply):
    """The planner's turn that concludes: the final answer."""

    answer: str = Field(min_length=1, max_length=ANSWER_CHARS, description="<short answer>")


class Worker(Reply):
    """A worker's reply: the numbers of the contexts that helped, and its answer."""

    relevant: list[int] = Field(description="[<numbers of the helpful contexts>]")
    answer: str = Field(min_length=1, max_length=ANSWER_CHARS, description="<short answer>")
