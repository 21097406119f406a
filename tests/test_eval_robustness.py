"""One bad question, reply or file never stops an evaluation; one run folder has one writer (issue 29)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mhqa_graph.graphs import SPECS, build_graph, make_context
from test_eval import write_dataset

from mhqa_graph.errors import IngestError, InvalidInput, ModelError
from mhqa_graph.eval import run_eval
from mhqa_graph.eval import runner as runner_module
from mhqa_graph.eval.report import Summary
from mhqa_graph.eval.runner import EvalInterrupted, RunLocked, load_questions, locked_run_folder
from mhqa_graph.ingest.files import read_passages_file, read_triples_file
from mhqa_graph.models.factory import check_chat_spec
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.traces import run_with_trace

SURROGATE_REPLY = "<answer>Tulsa \ud800</answer>"


@pytest.fixture
def data(tmp_path) -> Path:
    questions = ["Which city did Alpha play in \ud800?", "Who founded Gamma?", "Where?"]
    return write_dataset(tmp_path / "q.jsonl", {f"q{i}": (q, "Tulsa", "bridge", None) for i, q in enumerate(questions)})


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("agent", list(SPECS))
def test_lone_surrogates_in_questions_and_replies_do_not_stop_an_eval(tmp_path, data, agent):
    model = FakeChatModel(responses=[SURROGATE_REPLY])
    summary = run_eval(agent, "hotpotqa", data, None, f"embedded://{tmp_path}/s?embedder=hash", tmp_path / "run",
                       context_overrides={"llm": model}, progress=False)
    got = records(tmp_path / "run")
    assert summary.n == 3 and sorted(r["id"] for r in got) == ["q0", "q1", "q2"]
    assert not any("ValidationError" in (r["error"] or "") or "UnicodeEncodeError" in (r["error"] or "") for r in got)
    if agent in ("rag", "direct"):  # one call, the reply is the answer: U+FFFD stands for the surrogate
        assert {r["prediction"] for r in got} == {"Tulsa \ufffd"}


def test_a_record_that_cannot_be_made_is_the_questions_error(tmp_path, data, monkeypatch):
    made = runner_module.make_record

    def make_record(item, output, latency, trace, error=None):
        if item.id == "q1" and output is not None:
            raise ValueError("cannot score this output")
        return made(item, output, latency, trace, error)

    monkeypatch.setattr(runner_module, "make_record", make_record)
    run_eval("direct", "hotpotqa", data, None, f"embedded://{tmp_path}/s?embedder=hash", tmp_path / "run",
             context_overrides={"llm": FakeChatModel(responses=["<answer>Tulsa</answer>"])}, progress=False)
    got = {r["id"]: r for r in records(tmp_path / "run")}
    assert sorted(got) == ["q0", "q1", "q2"]
    assert got["q1"]["failed"] and got["q1"]["error"] == "ValueError: cannot score this output"
    assert not got["q0"]["failed"] and not got["q2"]["failed"]


def test_ask_prints_an_answer_and_a_trace_with_a_lone_surrogate(tmp_path):
    trace = tmp_path / "trace.json"
    done = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "ask", "Where is Alpha?", "--agent", "direct",
                           "--llm", 'fake:["<answer>Tulsa \\ud800</answer>"]', "--trace", str(trace)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Tulsa \ufffd"
    assert json.loads(trace.read_text(encoding="utf-8"))["answer"] == "Tulsa \ufffd"


@pytest.mark.parametrize("agent", list(SPECS))
def test_non_string_topic_entities_are_dropped(tmp_path, agent):
    uri = f"embedded://{tmp_path}/s?embedder=hash"
    with open_store(uri) as store:
        store.add_triples("kg", [(f"person {i}", "born in", f"town {i}") for i in range(20)])
    ctx = make_context(agent, llm=FakeChatModel(responses=[SURROGATE_REPLY]), store=uri,
                       graph=None if agent == "direct" else "kg")
    output, trace = run_with_trace(build_graph(agent), agent, "Where was person 3 born?", ctx,
                                   topic_entities=[3, None, "person 3"])
    assert trace.topic_entities == ["person 3"]
    json.loads(trace.model_dump_json())


HOLD = """
import sys, time
from pathlib import Path
from mhqa_graph.eval.runner import locked_run_folder
with locked_run_folder(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_eval_into_one_folder_is_refused(tmp_path, data):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RunLocked, match="another eval"):
            run_eval("direct", "hotpotqa", data, None, f"embedded://{tmp_path}/s?embedder=hash", tmp_path / "run",
                     context_overrides={"llm": FakeChatModel(responses=["<answer>Tulsa</answer>"])}, progress=False,
                     force_new=True)
        assert not (tmp_path / "run" / "results.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    with locked_run_folder(tmp_path / "run"):  # a killed holder leaves no lock behind
        pass


DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_json_is_a_bad_row(tmp_path, data, caplog):
    passages = tmp_path / "p.jsonl"
    passages.write_text(json.dumps({"id": "a", "title": "A", "text": "Alpha."}) + "\n" + DEEP + "\n")
    [good, bad] = list(read_passages_file(passages, yield_errors=True))
    assert good.id == "a" and isinstance(bad, IngestError) and bad.line == 2 and "nested too deeply" in str(bad)
    (tmp_path / "t.json").write_text("[" + DEEP + "]")
    [bad] = list(read_triples_file(tmp_path / "t.json", yield_errors=True))
    assert isinstance(bad, IngestError) and "nested too deeply" in str(bad)
    with data.open("a") as f:
        f.write(DEEP + "\n")
    with caplog.at_level("WARNING"):
        assert [item.id for item in load_questions("hotpotqa", data)] == ["q0", "q1", "q2"]
    assert "1 malformed question row skipped" in caplog.text and "nested too deeply" in caplog.text
    with pytest.raises(ModelError):
        check_chat_spec("fake:" + DEEP)
    for skip in ([], ["--skip-bad"]):
        done = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "ingest", "passages", str(passages),
                               "--corpus", "c", "--store", f"embedded://{tmp_path}/s?embedder=hash", *skip],
                              capture_output=True, text=True, timeout=120)
        assert "Traceback" not in done.stderr and done.returncode == (0 if skip else 2), done.stderr


def test_a_stalled_model_call_times_out_and_is_retried(tmp_path):
    model = FakeChatModel(latency=60)
    ctx = make_context("direct", llm=model, model_timeout=0.5, model_retries=1, retry_backoff=0)
    started = time.monotonic()
    output, trace = run_with_trace(build_graph("direct"), "direct", "Where is Alpha?", ctx)
    assert time.monotonic() - started < 10
    assert "after 2 attempts: TimeoutError" in output["error"] and "model_timeout" in output["error"]
    with pytest.raises(InvalidInput, match="model_timeout"):
        make_context("direct", llm=model, model_timeout=-1)
    done = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "ask", "Where?", "--agent", "direct",
                           "--llm", 'fake:["<answer>x</answer>"]', "--model-timeout", "5"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "x", done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["llamacpp:smollm2-135m?threads=1", "smollm2-135m"])
def test_an_abandoned_call_stops_generating_and_frees_the_model(spec, tmp_path, monkeypatch):
    """`model_timeout` over a model that generates in this process (llama.cpp, transformers): once the caller
    stops waiting, the generation ends at its next token, not after max_new_tokens, and the retry finds the
    model free."""
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import HumanMessage

    from mhqa_graph.models.factory import load_chat_model
    from mhqa_graph.models.timeout import TimeLimited

    class Ended(BaseCallbackHandler):
        def __init__(self) -> None:
            self.tokens: list[int] = []

        def on_llm_end(self, response, **kwargs) -> None:
            self.tokens.append(response.generations[0][0].message.usage_metadata["output_tokens"])

    monkeypatch.setenv("MHQA_CACHE", str(tmp_path))
    model = load_chat_model(spec, max_new_tokens=1000)
    prompt = [HumanMessage("Write a very long story about a dragon.")]  # runs to max_new_tokens
    assert model.invoke(prompt, max_new_tokens=2).usage_metadata["output_tokens"] == 2  # loaded
    ended = Ended()
    with pytest.raises(TimeoutError, match="model_timeout"):
        TimeLimited(model, 0.5).invoke(prompt, config={"callbacks": [ended]})
    deadline = time.monotonic() + 120
    while not ended.tokens and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ended.tokens and ended.tokens[0] < 200  # of up to 1,000: it stopped soon after the caller left
    assert model.invoke(prompt, max_new_tokens=3).usage_metadata["output_tokens"] == 3



def test_an_interrupt_that_strikes_a_gathered_task_is_drained_with_the_rest(caplog):
    """Ctrl-C raised inside one of several gathered tasks: asyncio re-raises it as the task awaiting the gather
    ends, while the run is being cancelled. The draining goes on: no task is destroyed pending (a clean-up that
    was under way), no exception is left unretrieved, and the interrupt reaches the caller."""
    async def interrupted() -> None:
        await asyncio.sleep(0)
        raise KeyboardInterrupt

    async def cleaning_up() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.shield(asyncio.sleep(0))  # as LangChain's on_chain_error callbacks

    async def main() -> None:
        await asyncio.gather(interrupted(), cleaning_up())

    with pytest.raises(KeyboardInterrupt):
        runner_module._interruptible(main(), workers=1)
    gc.collect()
    assert "Task was destroyed but it is pending" not in caplog.text
    assert "never retrieved" not in caplog.text


def test_ctrl_c_amid_many_questions_leaves_no_task_pending_and_resumes(tmp_path, caplog, request):
    """SIGINT while 16 questions run: EvalInterrupted, and no task is left pending for asyncio to complain about
    when it is collected (LangGraph's clean-ups of the cancelled runs); the rerun asks only the rest."""
    # Ctrl-C as in a terminal, even where the test runner was started with SIGINT ignored (a background job)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    data = write_dataset(tmp_path / "q.jsonl", {f"q{i}": (f"Where is town {i}?", "Tulsa", "bridge", None)
                                                for i in range(400)})
    calls = itertools.count()

    def respond(messages) -> str:
        if next(calls) == 100:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C, handled in the main thread
        return "<answer>Tulsa</answer>"

    def run(limit: int | None = None) -> Summary:
        return run_eval("rag", "hotpotqa", data, None, f"embedded://{tmp_path}/s?embedder=hash", tmp_path / "run",
                        limit=limit, concurrency=16, context_overrides={"llm": FakeChatModel(respond=respond)},
                        progress=False)

    with pytest.raises(EvalInterrupted) as interrupted:
        run()
    gc.collect()
    assert "Task was destroyed but it is pending" not in caplog.text
    done = interrupted.value.done
    assert done == len(records(tmp_path / "run")) < 400
    assert run(limit=done + 20).n == done + 20
    ids = [r["id"] for r in records(tmp_path / "run")]
    assert len(ids) == len(set(ids)) == done + 20
