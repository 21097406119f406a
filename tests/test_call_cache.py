"""The call cache (`--llm-cache`, the `llm_cache` setting; issue 61, 2): a rerun makes only the calls whose key is
new, a changed model file, adapter, grammar, tool list or reply length misses, a damaged file is an error and never
a reply, and records count the calls the cache answered."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGeneration
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.calls import ask, get_llm
from typer.testing import CliRunner

from mhqa_graph.cli import app
from mhqa_graph.errors import CorruptCache
from mhqa_graph.models.call_cache import CallCache, model_key
from mhqa_graph.models.llamacpp import LlamaCppChatModel
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.traces import TraceRecorder

REPLY = ChatGeneration(message=AIMessage("<answer>Paris</answer>"))


def llamacpp_key(tmp_path: Path, model: bytes = b"weights", lora: bytes | None = None, stop=None, **kwargs) -> str:
    """The cache key (llm_string) of a llama.cpp model over a file with `model` bytes (and an adapter)."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(model)
    adapter = ""
    if lora is not None:
        (tmp_path / "a.gguf").write_bytes(lora)
        adapter = str(tmp_path / "a.gguf")
    return LlamaCppChatModel(model_path=str(gguf), lora_path=adapter)._get_llm_string(stop=stop, **kwargs)


def test_a_key_holds_the_model_and_adapter_digests_not_their_paths(tmp_path):
    first, other = tmp_path / "a", tmp_path / "b"
    first.mkdir(), other.mkdir()
    assert llamacpp_key(first) == llamacpp_key(other)  # the same file elsewhere: the same key (another machine)
    assert llamacpp_key(first) != llamacpp_key(other, model=b"weights, changed")
    assert llamacpp_key(first, lora=b"adapter 1") != llamacpp_key(other, lora=b"adapter 2")
    assert llamacpp_key(first, lora=b"adapter 1") != llamacpp_key(other)
    assert str(first) not in llamacpp_key(first)


@pytest.mark.parametrize("change", [
    {"grammar": "root ::= \"a\""}, {"grammar": "root ::= \"b\""}, {"max_new_tokens": 64}, {"logprobs": True},
    {"tools": [{"type": "function", "function": {"name": "node_info"}}]}])
def test_a_changed_grammar_reply_length_or_tool_list_misses(tmp_path, change):
    assert llamacpp_key(tmp_path, **change) != llamacpp_key(tmp_path)
    assert llamacpp_key(tmp_path, stop=["</answer>"]) != llamacpp_key(tmp_path)


def test_a_sampling_call_is_never_answered_from_the_cache(tmp_path):
    cache = CallCache(tmp_path / "c.sqlite")
    key = model_key("k", {}, None, {}, repeatable=False)
    cache.update("prompt", key, [REPLY])
    assert cache.lookup("prompt", key) is None and len(cache) == 0


def test_a_rerun_with_the_cache_makes_no_model_call_and_records_count_them(tmp_path):
    """rag twice over one store with one cache: the second run's calls all come from the cache, the answers agree."""
    from mhqa_graph import Passage, open_store

    uri = f"embedded://{tmp_path}/kb?embedder=hash"
    with open_store(uri) as store:
        store.add_passages("wiki", [Passage("p1", "France", "Paris is the capital of France.")])
    model = FakeChatModel(responses=["<answer>Paris</answer>"])
    answers, usages = [], []
    for _ in range(2):
        context = make_context("rag", llm=model, store=uri, corpus="wiki", llm_cache=str(tmp_path / "calls.sqlite"))
        recorder = TraceRecorder("rag", context)
        out = build_graph("rag").invoke({"question": "Capital of France?"}, context=context,
                                        config={"callbacks": [recorder]})
        answers.append(out["answer"])
        usages.append(recorder.trace(out).usage())
    assert answers == ["Paris", "Paris"] and len(model.calls) == 1
    assert usages[0]["llm_calls"] == usages[1]["llm_calls"] == 1
    assert (usages[0]["llm_calls_cached"], usages[1]["llm_calls_cached"]) == (0, 1)


def test_other_messages_miss(tmp_path):
    model = FakeChatModel(responses=["<answer>Paris</answer>"])
    cached = str(tmp_path / "calls.sqlite")
    for question in ("Capital of France?", "Capital of France?", "Capital of Italy?"):
        ask(get_llm(make_context("direct", llm=model, llm_cache=cached), "answer"), [HumanMessage(question)])
    assert len(model.calls) == 2


def test_a_damaged_cache_file_is_an_error_never_a_reply(tmp_path):
    path = tmp_path / "calls.sqlite"
    path.write_bytes(b"not a database " * 100)
    with pytest.raises(CorruptCache, match="not a call cache"):
        CallCache(path)
    good = tmp_path / "good.sqlite"
    cache = CallCache(good)
    cache.update("prompt", "model", [REPLY])
    with sqlite3.connect(good) as db:
        db.execute("UPDATE calls SET reply = ?", (b"\x78\x9c garbage",))
    with pytest.raises(CorruptCache, match="cannot be read"):
        cache.lookup("prompt", "model")


def test_eval_with_the_cache_reruns_without_a_model_call(tmp_path):
    """`mhqa eval --llm-cache` into two run folders: the second run's records say every call came from the cache,
    and `mhqa report` shows it; a cache does not make a run another run (it resumes with or without one)."""
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"id": "q1", "question": "Who directed Inception?", "answer": "Christopher Nolan",
                                "context": {"title": ["Inception"], "sentences": [["Inception is a 2010 film directed "
                                                                                   "by Christopher Nolan."]]}}) + "\n",
                    encoding="utf-8")
    cache = tmp_path / "calls.sqlite"
    base = ["eval", str(data), "--dataset", "hotpotqa", "--agent", "rag", "--store",
            f"embedded://{tmp_path}/kb?embedder=hash", "--llm-cache", str(cache)]
    for out in ("first", "second"):
        done = CliRunner().invoke(app, [*base, "--llm", 'fake:["<answer>Christopher Nolan</answer>"]', "--out",
                                        str(tmp_path / out)])
        assert done.exit_code == 0, done.output
    records = [json.loads((tmp_path / out / "results.jsonl").read_text(encoding="utf-8"))
               for out in ("first", "second")]
    assert [r["prediction"] for r in records] == ["Christopher Nolan", "Christopher Nolan"]
    assert [(r["llm_calls"], r["llm_calls_cached"]) for r in records] == [(1, 0), (1, 1)]
    report = CliRunner().invoke(app, ["report", str(tmp_path / "first"), str(tmp_path / "second")])
    assert "(from the call cache)" in report.output and "1.0 (1.0)" in report.output
