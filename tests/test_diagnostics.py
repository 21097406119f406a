"""Hop-level diagnostics, protocol health and transcript replay, on scripted runs."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.calls import ask_json
from mhqa_graph.graphs.mujica import prompts as mujica_prompts
from mhqa_graph.graphs.omne import prompts as omne_prompts

from mhqa_graph.eval.diagnostics import diagnose, failure_summary, hop_seen
from mhqa_graph.eval.health import health, health_summary
from mhqa_graph.eval.report import summarize
from mhqa_graph.export import legacy_kinds
from mhqa_graph.ingest.datasets import Hop
from mhqa_graph.messages import FORCED, FORCED_FINAL, NUDGE, REPAIR, SEND_BACK, kind_of, legacy_kind
from mhqa_graph.replies import ReplyFormat
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.testing.replay import RecordingChatModel, RecordingStore, Transcript, Unrecorded
from mhqa_graph.traces import ChatMessage, LLMCall, Retrieved, Step, Trace

CHAIN = (Hop(answer="Christopher Nolan", triples=(("Inception", "directed by", "Christopher Nolan"),)),
         Hop(answer="Brendan Nolan", triples=(("Christopher Nolan", "father", "Brendan Nolan"),)))


def trace_showing(*lines: str, agent: str = "omne", outputs: tuple[str, ...] = ("",)) -> Trace:
    calls = [LLMCall(role="tool-agent", messages=[ChatMessage(role="user", content="\n".join(lines))], output=o)
             for o in outputs]
    return Trace(agent=agent, question="q", llm_calls=calls)


def test_a_triple_is_seen_when_one_shown_line_names_both_ends():
    seen = trace_showing("Entity: Inception", "- (Inception) -[directed by]-> (Christopher Nolan)")
    assert diagnose(CHAIN, seen, em=0.0, f1=0.0) == {
        "hops_seen": [True, False], "evidence_recall": 0.5, "first_missed_hop": 2, "failure": "retrieval"}
    both = trace_showing("(Inception) -[directed by]-> (Christopher Nolan)", "Christopher Nolan father Brendan Nolan")
    assert diagnose(CHAIN, both, em=0.0, f1=0.0)["failure"] == "reasoning"
    assert diagnose(CHAIN, both, em=0.0, f1=0.5)["failure"] == "format"
    assert diagnose(CHAIN, both, em=1.0, f1=1.0)["failure"] is None
    apart = trace_showing("Inception is a film.", "Christopher Nolan directed it.")  # not on one line
    assert diagnose(CHAIN, apart, em=0.0, f1=0.0)["hops_seen"] == [False, False]


def test_passages_are_seen_by_retrieved_id_and_hops_without_evidence_are_unknown():
    trace = Trace(agent="rag", question="q", steps=[Step(id="r", kind="retrieve", retrieved=[Retrieved(id="p2")])])
    chain = (Hop(passage_ids=("p1",)), Hop(passage_ids=("p2", "p3")))
    assert [hop_seen(h, {"p2"}, []) for h in chain] == [False, True]
    assert diagnose(chain, trace, 0.0, 0.0)["first_missed_hop"] == 1
    assert diagnose((Hop(answer="x"),), trace, 0.0, 0.0) == {
        "hops_seen": [None], "evidence_recall": None, "first_missed_hop": None, "failure": "unknown"}
    assert diagnose(chain, trace, 0.0, 0.0, failed=True)["failure"] == "error"


def test_failure_summary_counts_classes():
    records = [{"diagnostics": diagnose(CHAIN, trace_showing(), 0.0, 0.0)},
               {"diagnostics": diagnose(CHAIN, trace_showing(), 1.0, 1.0)}, {"no": "diagnostics"}]
    summary = failure_summary(records)
    assert summary["questions"] == 2 and summary["failures"]["retrieval"] == 1
    assert summary["evidence_recall"] == 0.0 and summary["first_missed_hop"] == {"1": 2}


def test_health_counts_invented_results_repairs_and_forced_answers():
    trace = trace_showing("q", outputs=("<tool_call>{}</tool_call><tool_response>made up</tool_response>", "x"))
    trace.llm_calls.append(LLMCall(role="tool-agent", messages=[ChatMessage(role="user", content=omne_prompts.NUDGE)]))
    trace.llm_calls.append(LLMCall(role="tool-agent", messages=[ChatMessage(role="user",
                                                                            content=omne_prompts.FORCE_ANSWER)]))
    trace.llm_calls.append(LLMCall(role="tool-agent", messages=[], cache_error="refused"))
    trace.design["tool_calls"] = [{"name": "node_info", "result_preview": "Error: no entity", "repeated": False}]
    row = health({"prediction": "a very long answer that goes on and on for more than ten words"}, trace)
    assert row == {"acted": False, "invented": 1, "malformed": False, "repairs": 1, "forced": 1, "forced_by": [],
                   "bad_answer": True, "guards": {}, "guard_changed": False, "answer_guard": False, "constrained": 0,
                   "cache_errors": 1}
    trace.design["error"] = "RoundCap: no answer within 7 rounds"
    assert health({"prediction": "x"}, trace)["forced_by"] == ["RoundCap"]
    sent_back = omne_prompts.ONE_HOP_SHORT.format(entity="Oswiu", relations="place of burial", facts="Entity: Oswiu")
    trace.llm_calls.append(LLMCall(role="tool-agent", messages=[ChatMessage(role="user", content=sent_back)]))
    assert health({"prediction": "x"}, trace)["repairs"] == 2
    assert health_summary([row, {**row, "acted": True}])["acted"] == 1
    assert health_summary([row, row])["cache_errors"] == 2


def test_forced_answers_say_why_from_the_typed_notes():
    """Mujica's planner forced by a round that planned nothing, and by the round cap: both kinds, once each."""
    trace = Trace(agent="mujica", question="q", llm_calls=[LLMCall(role="planner", messages=[ChatMessage(
        role="user", content=mujica_prompts.FINAL_USER.format(progress="q1 ...", conclude=mujica_prompts.CONCLUDE,
                                                              think=""))])])
    trace.design["notes"] = ["InvalidPlan: q2 dropped", "NoProgress: round 2 planned nothing that can run",
                             "RoundCap: round 3 of 3 must answer", "NoProgress: round 3 planned nothing that can run"]
    assert health({"prediction": "x"}, trace)["forced_by"] == ["NoProgress", "RoundCap"]
    trace.llm_calls.clear()  # not forced: the notes say nothing about it
    assert health({"prediction": "x"}, trace)["forced_by"] == []


def test_traces_written_before_kinds_are_read_by_the_designs_texts():
    """An old trace's messages have no kind: the forced-answer, repair, nudge and send-back texts the designs send
    still say what they are."""
    final = mujica_prompts.FINAL_USER.format(progress="q1 ...", conclude=mujica_prompts.CONCLUDE, think="")
    assert legacy_kind(omne_prompts.FORCE_ANSWER) == FORCED_FINAL and legacy_kind(final) == FORCED
    llm = FakeChatModel(responses=["no json here", '{"a": 1}'])
    assert ask_json(llm, [HumanMessage("q")], ReplyFormat("a"), dict, dict).value == {"a": 1}
    repair = llm.calls[-1][-1]
    assert kind_of(repair) == REPAIR  # tagged where it is made
    sent_back = omne_prompts.UNGROUNDED.format(answer="Paris")
    for text, kind in ((repair.text, REPAIR), (omne_prompts.NUDGE, NUDGE), (sent_back, SEND_BACK)):
        assert legacy_kind(text) == kind and legacy_kinds("user", text) == kind, text
    for text in ("Question: who?", f"see: {omne_prompts.NUDGE}"):
        assert legacy_kind(text) is None, text
    assert legacy_kinds("assistant", repair.text) is None


def test_eval_summary_carries_diagnostics_and_health(tmp_path):
    records = [{"id": "a", "em": 0.0, "f1": 0.0, "latency": 1.0, "tokens": {"total": 3}, "llm_calls": 1,
                "diagnostics": diagnose(CHAIN, trace_showing(), 0.0, 0.0),
                "health": health({"prediction": "x"}, trace_showing())}]
    summary = summarize(records)
    assert summary.diagnostics["failures"]["retrieval"] == 1 and summary.health["questions"] == 1


def test_the_report_shows_recall_failure_classes_and_first_missed_hops():
    from rich.console import Console

    from mhqa_graph.eval.report import compare_table

    def record(qid: str, trace: Trace) -> dict:
        return {"id": qid, "em": 0.0, "f1": 0.0, "latency": 1.0, "tokens": {"total": 3}, "llm_calls": 1,
                "diagnostics": diagnose(CHAIN, trace, 0.0, 0.0)}
    hop2 = trace_showing("(Inception) -[directed by]-> (Christopher Nolan)")
    runs = {"run": summarize([record("a", trace_showing()), record("b", hop2), record("c", hop2)])}
    console = Console(width=200, record=True)
    console.print(compare_table(runs))
    text = console.export_text()
    assert "gold evidence seen %" in text and "retrieval misses" in text
    assert "1: 1, 2: 2" in text  # one question never saw hop 1, two saw hop 1 but not hop 2


# -- replay ----------------------------------------------------------------------------------------
def test_recorded_run_replays_without_model_or_store(mhqa_store, tmp_path):
    real = FakeChatModel(responses=["Christopher Nolan"])
    llm, reads = RecordingChatModel(inner=real), RecordingStore(mhqa_store)
    graph = build_graph("rag")
    question = {"question": "Who directed Inception?"}
    first = graph.invoke(question, context=make_context("rag", llm=llm, store=reads, corpus="docs"))
    path = Transcript(meta={"agent": "rag"}, questions=[question], llm=llm.calls, store=reads.reads).save(
        tmp_path / "rag.json")
    transcript = Transcript.load(path)
    replay_llm, replay_store = transcript.replay_model(), transcript.replay_store()
    again = graph.invoke(question, context=make_context("rag", llm=replay_llm, store=replay_store, corpus="docs"))
    assert again["answer"] == first["answer"] == "Christopher Nolan" and again["retrieved"] == first["retrieved"]
    replay_llm.assert_complete()


def test_an_unrecorded_prompt_fails_and_says_how_to_re_record(mhqa_store):
    replay = Transcript().replay_model()
    out = build_graph("direct").invoke({"question": "Who directed Inception?"},
                                       context=make_context("direct", llm=replay, store=mhqa_store))
    assert "Unrecorded" in (out["error"] or "") or "no reply to this prompt" in (out["error"] or "")
    with pytest.raises(AssertionError, match="record_transcripts.py"):
        replay.assert_complete()
    with pytest.raises(Unrecorded):
        Transcript().replay_store().search("docs", "anything")
