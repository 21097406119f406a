"""OPERA (arXiv 2508.16438), the orchestrated planner-executor: its settings and state (`state`), prompts
(`prompts`), the plan and its placeholders (`plan`), the replies of its agents read (`analysis`), its guards'
rules (`guard_rules`) and the graph itself (`graph`, where the design is described)."""

from .graph import build
from .state import OperaContext

__all__ = ["OperaContext", "build"]
