"""Omne (arXiv 2508.17330), a tool agent walking a schema-free knowledge graph: its settings and state (`state`),
prompts (`prompts`), its tool calls' shapes (`replies`) and their text protocol (`protocol`), its guards' rules
(`guard_rules`), the graph itself (`graph`, where the design is described) and what it declares to the registry and
the core (`spec`)."""

from .graph import build
from .spec import SPEC
from .state import OmneContext

__all__ = ["SPEC", "OmneContext", "build"]
