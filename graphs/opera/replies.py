"""The replies of OPERA's JSON agents, one model each: the Plan agent's (its sub-goals as text, or with
`ask_as="relation"` each a relation of an entity), the Analysis-Answer agent's and the Rewrite agent's. A field's
description is how the prompt's format line shows it (`Reply.line`)."""

from __future__ import annotations

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from mhqa_graph.replies import ANSWER_CHARS, TEXT_CHARS, Reply

from ..mechanisms import RELATION_CHARS


class Plan(Reply):
    """The Plan agent's reply: the question's sub-goals, in the order they are solved."""

    subgoals: list[str] = Field(min_length=1, description='["first sub-goal", "second sub-goal using [Answer1]"]')


class RelationSubgoal(Reply):
    """A sub-goal written as one relation of one entity, asked as "What is the <relation> of <entity>?"."""

    entity: str = Field(min_length=1, max_length=ANSWER_CHARS, description="a name, or [AnswerN]")
    relation: str = Field(min_length=1, max_length=RELATION_CHARS, description="one relation")


class RelationPlan(Reply):
    """The Plan agent's reply with `ask_as="relation"`: each sub-goal a relation of an entity."""

    subgoals: list[RelationSubgoal] = Field(
        min_length=1, description='[{"entity": "...", "relation": "..."}, {"entity": "[Answer1]", "relation": "..."}]')


class Analysis(Reply):
    """The Analysis-Answer agent's reply: whether the passages state what the sub-goal asks for, and the answer."""

    reasoning: str = Field(min_length=0, max_length=400, description="one or two sentences")
    sufficient: bool | SkipJsonSchema[None] = Field(description="true or false")  # None: a prompted reply left it out
    answer: str = Field(min_length=0, max_length=ANSWER_CHARS, description="short answer")


class DirectAnalysis(Analysis):
    """The Analysis-Answer agent's reply without its reasoning (think off)."""

    reasoning: SkipJsonSchema[str] = ""


class Rewrite(Reply):
    """The Rewrite agent's reply: a new search query for the sub-goal."""

    query: str = Field(min_length=1, max_length=TEXT_CHARS, description="new search query")
