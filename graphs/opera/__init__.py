"""OPERA (arXiv 2508.16438), the orchestrated planner-executor: its settings and state (`state`), prompts (`prompts`),
the plan and its placeholders (`plan`), the reply shape of each agent (`replies`), the replies of its agents read
(`analysis`), its guards' rules (`guard_rules`), the graph itself (`graph`, where the design is described) and what
it declares to the registry and the core (`spec`)."""

from .graph import build
from .spec import SPEC
from .state import OperaContext

__all__ = ["SPEC", "OperaContext", "build"]
