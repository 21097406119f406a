"""The core's one way to a design: the spec it declares (`mhqa_graph.graphs.spec.DesignSpec`), by agent name. The
registry is imported when a spec is asked for, never when the core loads (tests/test_layout.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .graphs.spec import DesignSpec


def spec_of(agent: str) -> DesignSpec | None:
    """The spec of `agent`; None for a name no design declares (the trace of an unknown agent)."""
    from .graphs import SPECS

    return SPECS.get(agent)
