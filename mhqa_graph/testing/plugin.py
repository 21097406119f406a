"""pytest plugin (registered on install): fixtures to test apps built on mhqa-graph without a model.

    def test_my_app(mhqa_store, fake_llms):
        roles = fake_llms("opera", plan=['{"subgoals": ["Who directed Polish-Russian War?"]}'], analysis=[...],
                          rewrite=[...], answer=["Xawery Żuławski"])
        graph.invoke({"question": "..."}, context=make_context("opera", role_llms=roles, store=mhqa_store,
                                                               corpus="docs"))

Given an agent, `fake_llms` rejects a role the agent does not have (a typo such as `plann=` would
otherwise leave `plan` to the default model) and one it has but was not given a script. The reply
format of each role is in the `mhqa_graph.graphs` docstring and the README ("Testing your own app").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ..errors import InvalidInput
from ..store import KnowledgeStore, open_store
from .conformance import PASSAGES, TRIPLES
from .fakes import FakeChatModel


@pytest.fixture
def mhqa_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KnowledgeStore]:
    """A temporary embedded store (hash embedder, no model) with graph "kg" and corpus "docs"
    holding a few films, directors and places."""
    path = tmp_path_factory.mktemp("mhqa-store")
    with open_store(f"embedded://{path}?embedder=hash") as store:
        store.add_triples("kg", TRIPLES)
        store.add_passages("docs", PASSAGES)
        yield store


@pytest.fixture
def fake_llm() -> Callable[..., FakeChatModel]:
    """Make a scripted chat model: `fake_llm(["reply 1", "reply 2"], latency=0.1)` or `fake_llm(respond=fn)`."""

    def make(responses: list[str] | None = None, **kwargs: Any) -> FakeChatModel:
        return FakeChatModel(responses=responses, **kwargs)

    return make


@pytest.fixture
def fake_llms() -> Callable[..., dict[str, FakeChatModel]]:
    """Per-role scripts for an agent's `role_llms`: `fake_llms("opera", plan=[...], analysis=[...], ...)`;
    with the agent, every script must name one of its roles and every role needs a script. For `auto` (rag's role
    and one design's), the roles of the design left unscripted get a model that fails when called, so that every
    role has a model and none falls back to `llm`."""

    def make(agent: str | None = None, latency: float = 0.0,
             **scripts: list[str] | Callable) -> dict[str, FakeChatModel]:
        if agent is not None:
            check_roles(agent, scripts)
        models = {role: FakeChatModel(respond=s, latency=latency) if callable(s) else
                  FakeChatModel(responses=list(s), latency=latency) for role, s in scripts.items()}
        if agent == "auto":
            from ..graphs import SPECS

            models |= {role: FakeChatModel(respond=_unscripted(role)) for role in SPECS["auto"].roles
                       if role not in models}
        return models

    return make


def _unscripted(role: str) -> Callable[[Any], str]:
    """A fake's `respond` that fails, naming `role`: auto escalated to a design whose roles have no script."""

    def respond(messages: Any) -> str:
        raise InvalidInput(f"fake_llms('auto'): role {role!r} has no script (auto escalated to a design whose roles "
                           "were not scripted)")

    return respond


def check_roles(agent: str, scripts: dict[str, object]) -> None:
    """InvalidInput unless `scripts` has exactly the roles of `agent` (for `auto`: rag's role and the roles of
    one design it may escalate to)."""
    from ..graphs import SPECS, design_spec, make_context
    from ..graphs.auto import DESIGNS

    # an unknown agent fails here
    needs = [design_spec(agent).roles] if agent != "auto" else [(*SPECS["rag"].roles, *SPECS[d].roles) for d in DESIGNS]
    missing = min(([role for role in roles if role not in scripts] for roles in needs), key=len)
    # an unknown role fails here; the corpus or graph is the test's to give
    make_context(agent, require_source=False, role_llms={role: "fake" for role in scripts}, llm="fake")
    if missing:
        raise InvalidInput(f"fake_llms({agent!r}): no script for role(s) {', '.join(missing)}; "
                           "they would fall back to the default model")
