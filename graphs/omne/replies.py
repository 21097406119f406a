"""The tool calls of Omne's text protocol, one model per tool (`{"name": ..., "arguments": {...}}` inside a
`<tool_call>` block): what a constrained backend lets a call be (`prompts.tool_format`). The protocol reads the
replies (`protocol.parse_reply`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mhqa_graph.replies import TEXT_CHARS, Reply


class EntityMatcherArguments(Reply):
    """The arguments of entity_matcher."""

    query: str = Field(min_length=1, max_length=TEXT_CHARS, description="an entity name or short description")
    graph_type: str = Field(min_length=1, max_length=TEXT_CHARS, description="the knowledge graph to search")


class EntityMatcherCall(Reply):
    """A call of entity_matcher: the entities of a graph whose names best match a query."""

    name: Literal["entity_matcher"] = Field(description="entity_matcher")
    arguments: EntityMatcherArguments = Field(description="its arguments")


class NodeInfoArguments(Reply):
    """The arguments of node_info."""

    entity: str = Field(min_length=1, max_length=TEXT_CHARS, description="the exact entity name")
    graph_type: str = Field(min_length=1, max_length=TEXT_CHARS, description="the knowledge graph to search")


class NodeInfoCall(Reply):
    """A call of node_info: the facts of one entity of a graph."""

    name: Literal["node_info"] = Field(description="node_info")
    arguments: NodeInfoArguments = Field(description="its arguments")
