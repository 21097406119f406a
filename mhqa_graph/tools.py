"""Read-only LangChain tools over a store, shared by every agent: passage search, entity
matching and node facts. Tools never raise on bad arguments: the model gets an error text."""

from __future__ import annotations

from langchain_core.tools import BaseTool, StructuredTool

from .errors import MhqaError
from .store.base import KnowledgeStore
from .types import SearchMode

MAX_FACTS = 40
MAX_PASSAGE_CHARS = 1200
MAX_CONTEXT_CHARS = 8000  # retrieved text shown to a model in one step
TRUNCATED = "[truncated]"


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


def _pick_graph(graph_type: str | None, graphs: list[str]) -> str:
    if not graphs:
        raise MhqaError("no knowledge graph is configured for this agent")
    if not graph_type:
        return graphs[0]
    if graph_type not in graphs:
        raise MhqaError(f"unknown graph_type {graph_type!r}; use one of {', '.join(graphs)}")
    return graph_type


def search_passages_tool(store: KnowledgeStore, corpus: str, k: int = 5, mode: SearchMode = "hybrid") -> BaseTool:
    def search_passages(query: str) -> str:
        """Search the passage corpus. Returns the top passages, numbered."""
        try:
            return format_passages(store.search(corpus, str(query), k=k, mode=mode))
        except MhqaError as exc:
            return f"Error: {exc}"

    return StructuredTool.from_function(search_passages)


def entity_matcher_tool(store: KnowledgeStore, graphs: list[str], k: int = 5) -> BaseTool:
    def entity_matcher(query: str, graph_type: str = graphs[0] if graphs else "") -> str:
        """Find entities in the knowledge graph whose names match the query (semantic + lexical).
        Returns entity names, best first. graph_type names the graph to search."""
        try:
            hits = store.match_entities(_pick_graph(graph_type, graphs), str(query), k=k)
        except MhqaError as exc:
            return f"Error: {exc}"
        return cap_text("\n".join(f"{h.name}" for h in hits)) if hits else "No matching entities."

    return StructuredTool.from_function(entity_matcher)


def node_info_tool(store: KnowledgeStore, graphs: list[str], max_facts: int = MAX_FACTS) -> BaseTool:
    def node_info(entity: str, graph_type: str = graphs[0] if graphs else "") -> str:
        """Facts about one entity of the knowledge graph: its outgoing and incoming relations.
        Use an exact name returned by entity_matcher. graph_type names the graph."""
        try:
            info = store.node_info(_pick_graph(graph_type, graphs), str(entity))
        except MhqaError as exc:
            return f"Error: {exc}"
        lines = info.as_text().splitlines()
        if len(lines) - 1 > max_facts:
            lines = lines[:max_facts + 1] + [f"... {len(lines) - 1 - max_facts} more facts"]
        return cap_text("\n".join(lines))

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
