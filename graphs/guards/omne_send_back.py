"""What Omne's send-back guards check (graphs/guards/): whether a fact of the run holds the answer
(`send_back_ungrounded`), and whether the answer is one hop short of what the question asks
(`send_back_one_hop`), with the facts to send back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from langchain_core.messages import ToolMessage

from mhqa_graph.errors import EntityNotFound, MhqaError
from mhqa_graph.parsing import words
from mhqa_graph.text import topic_entities
from mhqa_graph.tools import open_relations
from mhqa_graph.types import NodeInfo

from ..calls import get_store

if TYPE_CHECKING:
    from ..omne_state import OmneContext, OmneState


def looked_into(state: OmneState) -> list[str]:
    """The entities that node_info returned facts for in this run."""
    return [str(r["args"].get("entity", "")) for r in state["tool_calls"]
            if r["name"] == "node_info" and not r["repeated"] and not r["result_preview"].startswith("Error")]


def start_node(ctx: OmneContext, state: OmneState) -> NodeInfo | None:
    """The entity the question starts from (its first topic entity, else the best match for the whole
    question), unless the run looked into it already; None if there is none."""
    looked = {words(e) for e in looked_into(state)}
    for graph in state["graphs"]:
        try:
            store = get_store(ctx)
            names = topic_entities(state.get("topic_entities")) or [
                h.name for h in store.match_entities(graph, state["question"], k=1)]
            node = store.node_info(graph, names[0]) if names else None
        except MhqaError:
            continue
        if node is not None:
            return None if words(node.name) in looked else node
    return None


def grounded(answer: str, state: OmneState) -> bool:
    """Whether a fact of the run (a successful node_info result) contains the answer; yes/no answers
    always are. A name that only entity_matcher listed is not: it was matched, not reached."""
    said = words(answer)
    if said in ("yes", "no"):
        return True
    results = (m.text for m in state["messages"]
               if isinstance(m, ToolMessage) and m.name == "node_info" and m.status != "error")
    return bool(said) and any(f" {said} " in f" {words(text)} " for text in results)


def one_hop_short(ctx: OmneContext, state: OmneState, answer: str) -> tuple[NodeInfo, list[str]] | None:
    """(the answer's node, relations) when the answer is a graph entity that the question does not
    name, that the run never looked into, and that has relations the question asks about which the
    walk so far has not covered (`tools.open_relations`): e.g. the father, for "where was X's father
    buried?"."""
    said = words(answer)
    looked = looked_into(state)
    if not said or f" {said} " in f" {words(state['question'])} " or said in {words(e) for e in looked}:
        return None
    for graph in state["graphs"]:
        try:
            store = get_store(ctx)
            node = store.node_info(graph, answer)
            path = []
            for entity in looked:
                try:
                    path.append(store.node_info(graph, entity))
                except EntityNotFound:
                    continue
        except MhqaError:
            continue
        if relations := open_relations(node, state["question"], path):
            return node, relations
    return None
