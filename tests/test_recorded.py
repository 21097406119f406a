"""Real model output, replayed through the real graphs: what qwen2.5-coder-1.5b did, pinned.

Each file in tests/recorded/ holds every model call (exact prompt, raw output) and store read that a
real run of one agent made on a few dev questions (scripts/record_transcripts.py). Replaying feeds the
same outputs back by prompt: a graph that now asks anything else fails with the re-record command. The
assertions are what the design promises under real output: tool calls parsed, invented results
rejected, placeholders filled, the DAG dispatched, the final answer extracted.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.answers import comparison
from mhqa_graph.graphs.calls import REPAIR_PREFIX, clean_answer
from mhqa_graph.graphs.omne.prompts import is_send_back
from mhqa_graph.graphs.omne.protocol import parse_reply
from mhqa_graph.graphs.option_guards import DATE_NOTE

from mhqa_graph.eval.scoring import score
from mhqa_graph.parsing import extract_tag
from mhqa_graph.testing.replay import Transcript
from mhqa_graph.traces import TraceRecorder

pytestmark = pytest.mark.recorded
RECORDED = Path(__file__).parent / "recorded"
FILES = sorted(p for p in RECORDED.glob("*.json") if not p.name.startswith("raw-"))
CASES = [(p, i) for p in FILES for i in range(len(json.loads(p.read_text(encoding="utf-8"))["questions"]))]
PLACEHOLDER = re.compile(r"\[[^\[\]]*\b(?:answer|step)\s*#?\d+[^\[\]]*\]|\{answer\d+\}|<answer\d+>", re.IGNORECASE)


@functools.cache
def replay(path: Path, i: int) -> tuple[dict, dict, object]:
    """(the recorded question, the graph's output on replay, its trace); each case is replayed once per
    session and shared by the tests that read it (none changes what it gets)."""
    transcript = Transcript.load(path)
    transcript.meta["file"] = path.name
    question = transcript.questions[i]
    agent = transcript.meta["agent"]
    llm, store = transcript.replay_model(), transcript.replay_store()
    context = make_context(agent, llm=llm, store=store, **transcript.meta["settings"])
    recorder = TraceRecorder(agent, context)
    inputs = {k: question[k] for k in ("question", "topic_entities") if k in question}
    out = build_graph(agent).invoke(inputs, context=context, config={"callbacks": [recorder]})
    llm.assert_complete()
    assert not store.misses, f"store reads not in {path.name}: {store.misses[:3]}"
    return question, out, recorder.trace(out, None)


@pytest.mark.parametrize("path, i", CASES, ids=[f"{p.stem}-{i}" for p, i in CASES])
def test_replay_reproduces_the_recorded_run(path: Path, i: int) -> None:
    question, out, trace = replay(path, i)
    assert out["answer"] == question["output"]["answer"] and out.get("error") == question["output"]["error"]
    agent = trace.agent
    if agent in ("rag", "direct"):  # the final answer is extracted: the <answer> tag where the model wrote one
        raw = trace.llm_calls[-1].output
        tagged = extract_tag(raw, "answer")
        assert out["answer"] and (not tagged or out["answer"] == clean_answer(tagged))
        assert "<think>" not in out["answer"] and "<answer>" not in out["answer"]
    elif agent == "omne":
        ai = [m for m in out["messages"] if isinstance(m, AIMessage)]
        assert not any("<tool_response>" in m.text for m in ai)  # invented results never kept
        for m in ai:
            if m.tool_calls:  # what stays is the reply through its last call
                assert m.text.rstrip().endswith(("</tool_call>", "}", "]"))
        raw = [c.output for c in trace.llm_calls]
        assert out["invented_results"] == sum(r.count("<tool_response>") for r in raw)
        sent = [i for i, m in enumerate(out["messages"]) if isinstance(m, HumanMessage) and is_send_back(m.text)]
        assert len(sent) <= 1 and all(isinstance(out["messages"][i + 1], AIMessage) for i in sent)  # answered anew
    elif agent == "mujica":
        workers = [c for c in trace.llm_calls  # a worker's repair reply is not another worker
                   if c.role == "worker" and not c.messages[-1].content.startswith(REPAIR_PREFIX)]
        assert len(workers) == len([s for s in trace.steps if s.kind == "subquestion"]) > 0 and out["dag"]
    elif agent == "opera":
        for step in trace.steps:  # a placeholder whose step answered is filled before retrieval
            assert not PLACEHOLDER.search(step.query), step.query
    if any(n.startswith(DATE_NOTE) for n in out.get("notes") or []):  # settled in code: one of the options
        assert out["answer"] in comparison(question["question"])[:2]


def test_a_date_comparison_is_settled_in_code_with_the_real_model() -> None:
    """On a recorded 2Wiki comparison, OPERA's sub-goals found a birth date for each director and the
    synthesis named the other film: the date_comparison guard names the film the dates pick, and the
    synthesis's own answer stays in its firing."""
    results = [replay(p, i) for p, i in CASES if p.stem == "opera-2wiki-kg"]
    settled = [(q, out, trace) for q, out, trace in results if any(n.startswith(DATE_NOTE) for n in out["notes"])]
    assert settled
    for q, out, trace in settled:
        assert out["answer"] in comparison(q["question"])[:2]
        [synthesis] = [c for c in trace.llm_calls if c.role == "answer"]
        [fired] = [f for f in out["guards"] if f["guard"] == "date_comparison"]
        assert fired["enforced"] and fired["after"] == out["answer"] != fired["before"]
        assert clean_answer(synthesis.output) == fired["before"]


def test_opera_fills_the_placeholders_the_real_model_wrote() -> None:
    """Across the recorded OPERA questions the real plan named earlier answers, and every such
    placeholder was filled from its step's answer before retrieval."""
    counts = [trace.design["placeholders"] for p, i in CASES if p.stem.startswith("opera-")
              for _, _, trace in [replay(p, i)]]
    written = sum(c["written"] for c in counts)
    assert written > 0 and sum(c["resolved"] for c in counts) == written


def test_omne_rejects_the_results_a_model_without_stop_sequences_invents() -> None:
    """Recorded from a provider that ignores stop sequences: the real model wrote `<tool_response>`
    blocks of its own. The graph counted them, kept none, and still ran real tool calls."""
    results = [replay(p, i) for p, i in CASES if p.stem.endswith("-nostop")]
    assert results and all(Transcript.load(p).meta["stop_sequences"] is False
                           for p in FILES if p.stem.endswith("-nostop"))
    assert sum(out["invented_results"] for _, out, _ in results) > 0
    for _, out, _ in results:
        assert not any("<tool_response>" in m.text for m in out["messages"] if isinstance(m, AIMessage))
    assert any(not c["repeated"] and not c["result_preview"].startswith("Error")
               for _, out, _ in results for c in out["tool_calls"])


def test_recordings_cover_every_agent() -> None:
    agents = {json.loads(p.read_text(encoding="utf-8"))["meta"]["agent"] for p in FILES}
    assert agents == {"direct", "rag", "opera", "mujica", "omne"}
    for p in FILES:
        meta = json.loads(p.read_text(encoding="utf-8"))["meta"]
        assert meta["model"] and meta["sha256"] and meta["date"], p.name


def test_omne_walks_the_graph_with_the_real_model() -> None:
    """Across the recorded Omne questions, the real model made real tool calls and reached answers."""
    results = [replay(p, i) for p, i in CASES if p.stem.startswith("omne-")]
    assert results
    acted = [out for _, out, _ in results if any(not c["repeated"] and not c["result_preview"].startswith("Error")
                                                 for c in out["tool_calls"])]
    assert len(acted) == len(results)
    assert sum(score(out["answer"], q["answers"])[1] for q, out, _ in results) > 0


def test_omne_answers_sent_back_are_revised_with_the_real_model() -> None:
    """Answers the run sent back (in no fact, or one hop short), with the facts they skipped where it had
    not looked: the real model mostly revised them (called a tool or answered anew); a repeated answer
    stands (one send-back per run)."""
    results = [replay(p, i) for p, i in CASES if p.stem.startswith("omne-")]
    sent = revised = 0
    for _, out, _ in results:
        messages = out["messages"]
        for i, m in enumerate(messages):
            if isinstance(m, HumanMessage) and is_send_back(m.text):
                before, after = parse_reply(messages[i - 1].text).answer, messages[i + 1]
                sent += 1
                revised += bool(after.tool_calls) or parse_reply(after.text).answer != before
    assert sent >= 3 and revised >= sent - 1


RAW = RECORDED / "raw-omne-before.json"


def test_old_protocol_replies_are_read_without_their_invented_results() -> None:
    """Replies qwen2.5-coder-1.5b wrote when nothing stopped it at <tool_response> (the protocol before the
    stop sequence): calls written as bare JSON are read, every invented result and answer after them is
    dropped, and calls written inside <tool_response> are not run."""
    raw = json.loads(RAW.read_text(encoding="utf-8"))
    assert raw["meta"]["model"] and raw["meta"]["sha256"]
    replies = raw["replies"]
    assert len(replies) >= 5
    for text in replies:
        reply = parse_reply(text)
        assert reply.invented == text.count("<tool_response>") and "<tool_response>" not in reply.kept
        if reply.calls:
            assert reply.answer is None and reply.kept.rstrip().endswith(("}", "]", "</tool_call>"))
    assert any(parse_reply(t).calls for t in replies)  # the bare-JSON calls before the invented result
    assert all(parse_reply(t).invented for t in replies)
