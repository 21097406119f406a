"""Typed notes (`mhqa_graph.notes`): made with their kind, kept as their text, read by their kind."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
from mhqa_graph.graphs import build_graph
from mhqa_graph.graphs.opera import OperaContext

from mhqa_graph.eval.health import forced_by
from mhqa_graph.notes import MALFORMED, NO_PROGRESS, ROUND_CAP, WARNING, Note, note, note_kind
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.traces import Trace
from mhqa_graph.types import Passage


def test_a_note_is_its_text_with_its_kind():
    made = note(ROUND_CAP, "round 3 of 3 must answer")
    assert made == "RoundCap: round 3 of 3 must answer" and made.kind == ROUND_CAP
    assert made.detail == "round 3 of 3 must answer" and json.dumps([made]) == '["RoundCap: round 3 of 3 must answer"]'
    for kept in (copy.deepcopy(made), pickle.loads(pickle.dumps(made))):
        assert kept == made and kept.kind == ROUND_CAP
    whole = Note("MalformedOutput: no JSON (plan; planned the question as one sub-goal)", MALFORMED)
    assert whole.kind == MALFORMED and whole.detail == "no JSON (plan; planned the question as one sub-goal)"


@pytest.mark.parametrize("text, kind", [(note(NO_PROGRESS, "round 2"), NO_PROGRESS),
                                        ("NoProgress: round 2 planned nothing", NO_PROGRESS),  # read back from JSON
                                        (note(WARNING, "sub-goal 2: empty rewrite"), WARNING)])
def test_the_kind_of_a_note_and_of_its_text(text, kind):
    assert note_kind(text) == kind


def test_health_reads_the_kinds_of_notes_kept_as_text():
    trace = Trace(agent="mujica", question="q", design={"notes": [str(note(NO_PROGRESS, "round 2")),
                                                                  str(note("InvalidPlan", "q2 dropped"))],
                                                        "error": str(note(ROUND_CAP, "no answer"))})
    assert forced_by(trace) == [NO_PROGRESS, ROUND_CAP]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('notes')}/s?embedder=hash")
    s.add_passages("wiki", [Passage("p1", "Inception", "Inception is a 2010 film directed by Christopher Nolan.")])
    yield s
    s.close()


def test_a_design_makes_its_notes_with_their_kind(store):
    """OPERA's empty synthesis is a MalformedOutput note, which is the run's error; the text is as before."""
    roles = {"plan": FakeChatModel(responses=['{"subgoals": ["Who directed Inception?"]}']),
             "analysis": FakeChatModel(responses=['{"sufficient": true, "answer": "Christopher Nolan"}']),
             "rewrite": FakeChatModel(responses=['{"query": "x"}']), "answer": FakeChatModel(responses=["   "])}
    ctx = OperaContext(llm=FakeChatModel(responses=["unused"]), role_llms=roles, store=store, corpus="wiki")
    out = build_graph("opera").invoke({"question": "Who directed Inception?"}, context=ctx)
    assert out["notes"] == ["MalformedOutput: empty final answer"] and out["error"] == out["notes"][0]
    assert [n.kind for n in out["notes"]] == [MALFORMED] and out["error"].kind == MALFORMED
