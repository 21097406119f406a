"""The llama.cpp chat backend: `llamacpp:` specs, the kept pack GGUF and a real smollm2 run."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from mhqa_graph.errors import ChecksumMismatch, ModelError, ModelNotInstalled
from mhqa_graph.models import factory, packs
from mhqa_graph.models.factory import load_chat_model
from mhqa_graph.models.llamacpp import LlamaCppChatModel
from mhqa_graph.models.logprobs import answer_logprobs, confidence
from mhqa_graph.models.packs import PACKS, Pack, pack_installed
from mhqa_graph.replies import answer_reply

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
ROOT = Path(__file__).resolve().parents[1]
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


@pytest.fixture
def llama_cpp_present(monkeypatch):
    """Spec parsing as if llama-cpp-python were installed; nothing is loaded."""
    real = importlib.util.find_spec
    monkeypatch.setattr(factory.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "llama_cpp" else real(name, *a))


@pytest.fixture
def no_llama_cpp(monkeypatch):
    for name in ("llama_cpp", "llama_cpp.llama_chat_format"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import llama_cpp` fail


@pytest.fixture
def fake_pack(monkeypatch, tmp_path):
    """A chat pack 'toy' whose two parts live in tmp_path; the cache is tmp_path/cache/models."""
    parts = [tmp_path / "p1.bin", tmp_path / "p2.bin"]
    parts[0].write_bytes(b"GGUF-toy-")
    parts[1].write_bytes(b"weights")
    sha = hashlib.sha256(b"GGUF-toy-weights").hexdigest()
    monkeypatch.setitem(PACKS, "toy", Pack("toy", "chat", ("toy==1",), ("toy.bin",), sha, "models", "", ""))
    monkeypatch.setattr(packs, "_installed_files", lambda pack: parts)
    monkeypatch.setenv("MHQA_CACHE", str(tmp_path / "cache"))
    return parts


def test_spec_options_and_gguf_file(llama_cpp_present, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    model = load_chat_model(f"llamacpp:{gguf}?threads=1&ctx=2048", max_new_tokens=7)
    assert isinstance(model, LlamaCppChatModel)
    assert (model.model_path, model.n_threads, model.n_ctx, model.max_new_tokens) == (str(gguf), 1, 2048, 7)
    assert model._name == "m" and model._llm is None  # nothing loaded before the first call
    defaults = load_chat_model(f"llamacpp:{gguf}")
    assert (defaults.n_threads, defaults.n_ctx, defaults.lora_path) == (0, 0, "")
    adapter = tmp_path / "adapter.gguf"
    adapter.write_bytes(b"GGUF")  # checked before llama.cpp reads it (tests/test_shipped_adapters.py)
    with pytest.raises(ModelError, match="is not a llama.cpp LoRA adapter|cannot be read as GGUF"):
        load_chat_model(f"llamacpp:{gguf}?lora=file:{adapter}&threads=1")


@pytest.mark.parametrize("rest, message", [
    ("smollm2-135m?threads=0", "positive integer"),
    ("smollm2-135m?threads=two", "positive integer"),
    ("smollm2-135m?ctx=", "positive integer"),
    ("smollm2-135m?gpu=1", "unknown option 'gpu'"),
    ("smollm2-135m?lora=/nonexistent/adapter.gguf", "lora must name a shipped adapter"),
    ("smollm2-135m?lora=file:/nonexistent/adapter.gguf", "lora=file: names no file"),
    ("all-minilm-l6-v2", "embedding pack"),
    ("no-such-pack", "chat pack name"),
    ("/nonexistent/model.gguf", "existing .gguf file"),
    ("", "chat pack name"),
])
def test_bad_llamacpp_specs(llama_cpp_present, rest, message):
    with pytest.raises(ModelError, match=message):
        load_chat_model(f"llamacpp:{rest}")


def test_unknown_spec_names_llamacpp():
    with pytest.raises(ModelError, match=r"llamacpp:<pack name or \.gguf file>"):
        load_chat_model("llama:smollm2-135m")


def test_missing_llama_cpp_names_the_extra(no_llama_cpp, fake_pack, tmp_path):
    with pytest.raises(ModelNotInstalled, match=r"mhqa-graph\[llamacpp\]"):
        load_chat_model("llamacpp:toy")
    assert not (tmp_path / "cache").exists()  # failed before assembling anything
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelNotInstalled, match=r"mhqa-graph\[llamacpp\]"):
        LlamaCppChatModel(model_path=str(gguf)).invoke("hi")


def test_pack_spec_uses_the_kept_gguf(llama_cpp_present, fake_pack, tmp_path):
    model = load_chat_model("llamacpp:toy?threads=2")
    assert model.model_name == "toy" and model.n_threads == 2
    assert model.model_path == str(tmp_path / "cache" / "models" / "toy.gguf")


def test_gguf_path_assembles_once_and_keeps_it(fake_pack, monkeypatch, tmp_path):
    gguf = packs.gguf_path("toy")
    assert gguf == tmp_path / "cache" / "models" / "toy.gguf"
    assert gguf.read_bytes() == b"GGUF-toy-weights"
    assert gguf.with_name("toy.gguf.sha256").read_text().strip() == PACKS["toy"].sha256
    calls = []
    monkeypatch.setattr(packs, "assemble", lambda *a, **k: calls.append(a))
    assert packs.gguf_path("toy") == gguf and calls == []  # verified once, not rehashed
    gguf.unlink()
    packs.gguf_path("toy")
    assert len(calls) == 1  # a missing file is assembled again


def test_gguf_path_checksum_mismatch_keeps_nothing(fake_pack, tmp_path):
    fake_pack[1].write_bytes(b"tampered")
    with pytest.raises(ChecksumMismatch):
        packs.gguf_path("toy")
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir()) == []


def test_gguf_path_rejects_embedding_packs():
    with pytest.raises(ModelError, match="embedding pack"):
        packs.gguf_path("all-minilm-l6-v2")


def test_pull_leaves_a_kept_gguf_in_place(fake_pack, monkeypatch, tmp_path):
    def convert(gguf, dest, sha256):
        assert gguf.read_bytes() == b"GGUF-toy-weights"
        dest.mkdir()
        (dest / packs.MARKER).write_text(sha256 + "\n")

    monkeypatch.setattr(packs, "_convert", convert)
    gguf = packs.gguf_path("toy")
    assert packs.pull("toy") == tmp_path / "cache" / "models" / "toy"
    assert gguf.is_file() and packs.pack_pulled("toy")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_LLAMA_CPP or not pack_installed("smollm2-135m"),
                    reason="needs llama-cpp-python and the smollm2-135m pack")
def test_smollm2_llamacpp_generates(monkeypatch, tmp_path):
    monkeypatch.setenv("MHQA_CACHE", str(tmp_path))
    model = load_chat_model("llamacpp:smollm2-135m?threads=1", max_new_tokens=16)
    reply = model.invoke([HumanMessage("What is the capital of France? Answer in one word.")])
    assert (tmp_path / "models" / "smollm2-135m.gguf").is_file()
    assert "paris" in reply.content.lower()
    usage = reply.usage_metadata
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 16
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert reply.response_metadata["model_name"] == "smollm2-135m"
    assert reply.response_metadata["truncated_tokens"] == 0

    stopped = model.invoke("Count from 1 to 10, separated by commas.", stop=["5"], max_new_tokens=40)
    assert "5" not in stopped.content and stopped.response_metadata["finish_reason"] == "stop"
    capped = model.invoke("Write a long story about a dragon.", max_new_tokens=5)
    assert capped.usage_metadata["output_tokens"] == 5 and capped.response_metadata["finish_reason"] == "length"

    ask = [HumanMessage("What is the capital of France? Reply as <answer>city</answer>.")]  # log-probabilities
    grammar = answer_reply("answer", think=False).gbnf()
    plain, scored = model.invoke(ask, grammar=grammar), model.invoke(ask, grammar=grammar, logprobs=True)
    assert scored.text == plain.text and "logprobs" not in plain.response_metadata  # the same reply either way
    tokens = scored.response_metadata["logprobs"]["content"]
    assert scored.text.startswith("".join(t["token"] for t in tokens))  # all but the last token, in order
    assert all(t["logprob"] <= 0 for t in tokens) and 0 < confidence(answer_logprobs(scored)) <= 1

    small = load_chat_model("llamacpp:smollm2-135m?threads=1&ctx=96", max_new_tokens=8)
    long = [SystemMessage("Answer briefly."), HumanMessage("filler " * 300 + "What is 2 + 2?")]
    cut = small.invoke(long)
    assert cut.response_metadata["truncated_tokens"] > 200
    assert cut.usage_metadata["input_tokens"] + 8 <= 96
    with pytest.raises(ModelError, match="leaves no room"):
        small.invoke(long, max_new_tokens=96)


def test_default_threads_are_the_cores_the_process_may_use(monkeypatch):
    from mhqa_graph.models import llamacpp

    monkeypatch.setattr(llamacpp.os, "sched_getaffinity", lambda pid: {1}, raising=False)
    assert llamacpp.usable_cores() == 1  # e.g. under `taskset -c 1`, not os.cpu_count()


def test_llama_flags_turn_amx_off_once():
    """scripts/llama_flags.sh adds -mno-amx-* once, however often it is sourced: llama_server.sh keys its
    binary on the flags, so a second sourcing (install.sh, then llama_server.sh) must not change them."""
    twice = ". scripts/llama_flags.sh; . scripts/llama_flags.sh; printf '%s|%s' \"$CFLAGS\" \"${CXXFLAGS:-}\""
    done = subprocess.run(["bash", "-c", twice], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={"PATH": os.environ["PATH"], "CFLAGS": "-O2"})
    if platform.machine() == "x86_64":
        assert done.stdout == f"-O2 {NO_AMX}|{NO_AMX}"
    else:
        assert done.stdout == "-O2|"


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="needs the llamacpp extra")
def test_the_installed_llama_cpp_has_no_amx_kernels():
    """ggml's AMX kernels segfault at the first model load on CPUs with AMX units; scripts/install.sh builds
    llama-cpp-python without them, and rebuilds one that has them."""
    import llama_cpp

    assert b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info(), "rebuild it: bash scripts/install.sh"
