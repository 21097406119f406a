"""Mujica (arXiv 2505.17086), a planner over a DAG of sub-questions that workers answer: its settings and state
(`state`), prompts (`prompts`), the reply shapes of the planner and workers (`replies`), the DAG (`plan`), the
planner's conversation (`chat`), its guards' rules (`guard_rules`), the conclusion step (`conclusion`), the graph
itself (`graph`, where the design is described) and what it declares to the registry and the core (`spec`)."""

from .graph import build
from .spec import SPEC
from .state import MujicaContext

__all__ = ["SPEC", "MujicaContext", "build"]
