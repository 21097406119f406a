"""Mujica (arXiv 2505.17086), a planner over a DAG of sub-questions that workers answer: its settings and state
(`state`), prompts (`prompts`), the DAG (`plan`), the planner's conversation (`chat`), its guards' rules
(`guard_rules`), the conclusion step (`conclusion`) and the graph itself (`graph`, where the design is
described)."""

from .graph import build
from .state import MujicaContext

__all__ = ["MujicaContext", "build"]
