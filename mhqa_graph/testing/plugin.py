"""pytest plugin (registered on install): fixtures to test apps built on mhqa-graph without a model.

    def test_my_app(mhqa_store, fake_llms):
        roles = fake_llms(plan=['{"subgoals": ["Who directed Polish-Russian War?"]}'], analysis=[...])
        graph.invoke({"question": "..."}, context=OperaContext(role_llms=roles, store=mhqa_store, corpus="docs"))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

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
    """Per-role scripts for an agent's `role_llms`: `fake_llms(plan=[...], analysis=[...])`."""

    def make(latency: float = 0.0, **scripts: list[str] | Callable) -> dict[str, FakeChatModel]:
        return {role: FakeChatModel(respond=s, latency=latency) if callable(s) else
                FakeChatModel(responses=list(s), latency=latency) for role, s in scripts.items()}

    return make
