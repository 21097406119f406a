"""The fixtures our pytest plugin gives users (registered through the pytest11 entry point)."""

import pytest

from mhqa_graph.errors import InvalidInput


def test_store_fixture_has_a_graph_and_a_corpus(mhqa_store):
    assert mhqa_store.graphs() == ["kg"] and mhqa_store.corpora() == ["docs"]
    assert mhqa_store.search("docs", "Lviv", k=1)[0].title == "Lviv"


def test_fake_llms_script_each_role(fake_llms, fake_llm):
    roles = fake_llms(plan=["p1", "p2"], analysis=lambda messages: "seen " + messages[-1].text)
    assert roles["plan"].invoke("x").text == "p1" and roles["plan"].invoke("x").text == "p2"
    assert roles["analysis"].invoke("hello").text == "seen hello"
    assert fake_llm(["only"]).invoke("x").usage_metadata["output_tokens"] == 1


def test_fake_llms_for_an_agent_take_exactly_its_roles(fake_llms):
    roles = fake_llms("mujica", planner=['{"answer": "Lviv"}'], worker=['{"relevant": [], "answer": ""}'])
    assert set(roles) == {"planner", "worker"}
    with pytest.raises(InvalidInput, match=r"role_llms has no role 'plann' \(did you mean 'plan'\?\)"):
        fake_llms("opera", plann=["x"], analysis=["x"], rewrite=["x"], answer=["x"])
    with pytest.raises(InvalidInput, match="no script for role.* worker"):
        fake_llms("mujica", planner=["x"])
    with pytest.raises(InvalidInput, match="unknown agent 'oprea'"):
        fake_llms("oprea", plan=["x"])


def test_fake_llms_for_auto_work_as_the_guide_shows_without_an_offline_pack(fake_llms, mhqa_store, monkeypatch):
    """`fake_llms("auto", ...)` scripts rag's role and one design's; with no chat pack installed (the light
    install), make_context takes it without `llm`, and a call to the unscripted design's roles fails loudly
    (issue 64, 4)."""
    from mhqa_graph.graphs import build_graph, make_context

    from mhqa_graph.models import factory

    monkeypatch.setattr(factory, "best_installed_chat_pack", lambda: None)
    roles = fake_llms("auto", answer=["<answer>Xawery Żuławski</answer>"],
                      **{"tool-agent": ["<answer>Andrzej Żuławski</answer>"]})
    ctx = make_context("auto", role_llms=roles, store=mhqa_store, graph="kg")
    out = build_graph("auto").invoke({"question": "Who is the father of the director of Polish-Russian War?"},
                                     context=ctx)
    assert out["answer"] == "Andrzej Żuławski" and out["answered_by"] == "omne"
    with pytest.raises(InvalidInput, match="fake_llms\\('auto'\\): role 'plan' has no script"):
        roles["plan"].invoke("x")
