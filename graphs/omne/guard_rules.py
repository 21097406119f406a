"""Omne's guards (graphs/guards/ names and switches them) with their rules, at its one guarded stage, the tool
agent's answer (`send_back`): whether a fact of the run holds the answer (`send_back_ungrounded`), and whether
the answer is one hop short of what the question asks (`send_back_one_hop`), with the facts to send back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from langchain_core.messages import ToolMessage

from mhqa_graph.errors import EntityNotFound, MhqaError
from mhqa_graph.parsing import words
from mhqa_graph.text import topic_entities
from mhqa_graph.tools import open_relations, render_node
from mhqa_graph.types import NodeInfo

from ..calls import get_store
from ..guards import SEND_BACK_ONE_HOP, SEND_BACK_UNGROUNDED, Rule, first_that_fires
from . import prompts as P

if TYPE_CHECKING:
    from .state import OmneContext, OmneState


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


def send_back(ctx: OmneContext, state: OmneState, answer: str, firings: list[dict]) -> str | None:
    """The send-back guards on the tool agent's answer, the first that fires ending the chain: the message that
    sends it back with the facts it skipped, when no fact of the run contains it (`send_back_ungrounded`: the facts
    of the entity the question starts from, unless the run looked into it), or when it is one hop short
    (`send_back_one_hop`: the facts of the answer entity); None when neither acts. Firings go to `firings`."""
    left: list = []  # what the one-hop check found: the answer's node and the relations the walk left open

    def one_hop() -> bool:
        left[:] = one_hop_short(ctx, state, answer) or ()
        return bool(left)

    fired = len(firings)
    acted = first_that_fires(ctx, [Rule(SEND_BACK_UNGROUNDED, lambda: not grounded(answer, state), answer,
                                        "sent back"),
                                   Rule(SEND_BACK_ONE_HOP, one_hop, answer, "sent back")], firings)
    if left and len(firings) > fired:
        firings[-1]["after"] = f"sent back with the facts of {left[0].name}"
    if acted is SEND_BACK_UNGROUNDED:
        if start := start_node(ctx, state):
            facts = render_node(start, state["question"], max_chars=ctx.result_chars)
            return P.UNGROUNDED_FACTS.format(answer=answer, entity=start.name, facts=facts)
        return P.UNGROUNDED.format(answer=answer)
    if acted is SEND_BACK_ONE_HOP:
        node, relations = left
        return P.ONE_HOP_SHORT.format(entity=node.name, relations=", ".join(relations),
                                      facts=render_node(node, state["question"], max_chars=ctx.result_chars))
    return None
