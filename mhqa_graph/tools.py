"""Read-only LangChain tools over a store, shared by every agent: passage search, entity
matching and node facts. Tools never raise on bad arguments: the model gets an error text."""

from __future__ import annotations

import re
from collections import Counter

from langchain_core.tools import BaseTool, StructuredTool

from .errors import EntityNotFound, MhqaError
from .parsing import words
from .store.base import KnowledgeStore
from .types import Fact, NodeInfo, SearchMode

MAX_FACTS = 40
MAX_PASSAGE_CHARS = 1200
MAX_CONTEXT_CHARS = 8000  # retrieved text shown to a model in one step
TRUNCATED = "[truncated]"
STOPWORDS = frozenset("a an and are as at be by did does for from has have in is it its of on or the to was were what "
                      "when where which who whom whose why how".split())


def cap_text(text: str, limit: int = MAX_CONTEXT_CHARS) -> str:
    """`text` cut to at most `limit` characters (limit > 12), ending in a "[truncated]" line if it was cut."""
    if len(text) <= limit:
        return text
    return text[:limit - len(TRUNCATED) - 1].rstrip() + "\n" + TRUNCATED


def format_passages(hits: list, max_chars: int = MAX_PASSAGE_CHARS, max_total: int = MAX_CONTEXT_CHARS) -> str:
    """Numbered passages as the agents show them to a model: each cut to `max_chars`, all to `max_total`."""
    if not hits:
        return "No passages found."
    return cap_text("\n\n".join(f"[{i}] {h.title}: {h.text[:max_chars]}" for i, h in enumerate(hits, start=1)),
                    max_total)


def pick_graph(graph_type: str | None, graphs: list[str]) -> str:
    """The graph a call names; with one graph, that graph whatever was named (small models invent
    names); else an error listing the valid ones."""
    if not graphs:
        raise MhqaError("no knowledge graph is configured for this agent")
    if not graph_type or graph_type in graphs or len(graphs) == 1:
        return graph_type if graph_type in graphs else graphs[0]
    raise MhqaError(f"unknown graph_type {graph_type!r}; use one of {', '.join(graphs)}")


_DESCRIPTION = re.compile(r"\s*\((?:\d+ facts?:[^()]*|no facts)\)\s*$")  # as describe_node writes it


# verbs a question uses for a relation named by a noun
_IRREGULAR = {"born": "birth", "die": "death", "died": "death", "dies": "death", "married": "spouse",
              "wife": "spouse", "husband": "spouse", "buried": "burial"}


def stems(text: str) -> set[str]:
    """Content words (3+ letters, no stopwords) as crude stems, for matching a question with relation
    names or sub-questions: irregular forms mapped (born -> birth), then the first five letters
    (nationality ~ nation, directed ~ director)."""
    return {_IRREGULAR.get(w, w)[:5] for w in re.findall(r"[^\W_]+", text.lower()) if len(w) > 2 and w not in STOPWORDS}


def ranked_facts(info: NodeInfo, question: str | None) -> list[Fact]:
    """The node's facts, those whose relation words occur in the question first (then those whose
    other entity does), each group in stored order."""
    if not question:
        return list(info.facts)
    asked = stems(question)
    return sorted(info.facts, key=lambda f: (-len(stems(f.relation) & asked), -len(stems(f.other) & asked)))


def open_relations(node: NodeInfo, question: str, path: list[NodeInfo]) -> list[str]:
    """The node's outgoing relations that the question asks about and the walk along `path` (the
    nodes looked into before) has not covered: what is left to follow when `node` is the answer
    reached so far. Empty when `node` is a plausible final answer."""
    visited = {words(n.name) for n in path} | {words(node.name)}
    walked = set().union(*(stems(f.relation) for n in path for f in n.facts if words(f.other) in visited))
    asked = stems(question) - walked
    return list(dict.fromkeys(f.relation for f in node.facts if f.direction == "out" and stems(f.relation) & asked))


def describe_node(info: NodeInfo, question: str | None = None, relations: int = 4) -> str:
    """`name (12 facts: spouse, nationality, ...)`: an entity as entity_matcher lists it, with the
    relations the question asks about first, then the most frequent."""
    counts = Counter(f.relation for f in info.facts)
    asked = stems(question or "")
    names = sorted(counts, key=lambda r: (-len(stems(r) & asked), -counts[r]))[:relations]
    more = ", ..." if len({f.relation for f in info.facts}) > relations else ""
    return f"{info.name} ({len(info.facts)} facts: {', '.join(names)}{more})" if info.facts else \
        f"{info.name} (no facts)"


def render_node(info: NodeInfo, question: str | None = None, max_facts: int = MAX_FACTS,
                max_chars: int = MAX_CONTEXT_CHARS) -> str:
    """The node's facts, one per line, most relevant to `question` first, within `max_facts` and
    `max_chars`, ending with a note of how many facts were left out."""
    facts = ranked_facts(info, question)
    lines, size = [f"Entity: {info.name}"], len(info.name) + 8
    for fact in facts[:max_facts]:
        line = f"- {fact.as_text(info.name)}"
        if size + len(line) + 1 > max_chars - 40:
            break
        lines.append(line)
        size += len(line) + 1
    left = len(facts) - (len(lines) - 1)
    if left:
        lines.append(f"... {left} more facts not shown")
    return "\n".join(lines)


def search_passages_tool(store: KnowledgeStore, corpus: str, k: int = 5, mode: SearchMode = "hybrid") -> BaseTool:
    def search_passages(query: str) -> str:
        """Search the passage corpus. Returns the top passages, numbered."""
        try:
            return format_passages(store.search(corpus, str(query), k=k, mode=mode))
        except MhqaError as exc:
            return f"Error: {exc}"

    return StructuredTool.from_function(search_passages)


def entity_matcher_tool(store: KnowledgeStore, graphs: list[str], k: int = 5, describe: bool = False,
                        question: str | None = None) -> BaseTool:
    """entity_matcher over `graphs`: names, or with `describe` each name with its degree and a few of
    its relations (those `question` asks about first)."""

    def entity_matcher(query: str, graph_type: str = graphs[0] if graphs else "") -> str:
        """Find entities in the knowledge graph whose names match the query (semantic + lexical).
        Returns entity names, best first. graph_type names the graph to search."""
        try:
            graph = pick_graph(graph_type, graphs)
            hits = store.match_entities(graph, str(query), k=k)
            if not describe:
                return cap_text("\n".join(h.name for h in hits)) if hits else "No matching entities."
            return cap_text("\n".join(describe_node(store.node_info(graph, h.name), question) for h in hits)) if hits \
                else "No matching entities."
        except MhqaError as exc:
            return f"Error: {exc}"

    return StructuredTool.from_function(entity_matcher)


def node_info_tool(store: KnowledgeStore, graphs: list[str], max_facts: int = MAX_FACTS,
                   max_chars: int = MAX_CONTEXT_CHARS, question: str | None = None) -> BaseTool:
    """node_info over `graphs`: the facts most relevant to `question` first, at most `max_facts` and
    `max_chars`; an unknown name gets the closest matching names."""

    def node_info(entity: str, graph_type: str = graphs[0] if graphs else "") -> str:
        """Facts about one entity of the knowledge graph: its outgoing and incoming relations.
        Use an exact name returned by entity_matcher. graph_type names the graph."""
        entity = _DESCRIPTION.sub("", str(entity))  # a name copied with entity_matcher's description
        try:
            graph = pick_graph(graph_type, graphs)
            info = store.node_info(graph, entity)
        except EntityNotFound as exc:
            try:
                close = [h.name for h in store.match_entities(exc.graph, str(entity), k=3)]
            except MhqaError:
                close = []
            hint = f" The closest names: {'; '.join(close)}." if close else ""
            return f"Error: no entity named {str(entity)!r} in graph {exc.graph!r}.{hint} Use an exact name."
        except MhqaError as exc:
            return f"Error: {exc}"
        return cap_text(render_node(info, question, max_facts, max_chars), max_chars)

    return StructuredTool.from_function(node_info)


def make_tools(store: KnowledgeStore, corpus: str | None = None, graphs: list[str] | None = None,
               k: int = 5) -> list[BaseTool]:
    """The tools that apply: passage search when a corpus is given, KG tools when graphs are."""
    tools: list[BaseTool] = []
    if corpus:
        tools.append(search_passages_tool(store, corpus, k=k))
    if graphs:
        tools += [entity_matcher_tool(store, graphs, k=k), node_info_tool(store, graphs)]
    return tools
