"""Omne (arXiv 2508.17330), a tool agent walking a schema-free knowledge graph: its settings and state (`state`),
prompts (`prompts`), the text protocol of its tool calls (`protocol`), its guards' rules (`guard_rules`) and the
graph itself (`graph`, where the design is described)."""

from .graph import build
from .state import OmneContext

__all__ = ["OmneContext", "build"]
