"""The LoRA adapters the project ships (mhqa_graph/models/adapters.py): loadable by name as
`llamacpp:<pack>?lora=<name>`, written once as a llama.cpp adapter from their PEFT weights, refused over another
pack or under an unknown name; and each one's folder loads into its base for training (`training/evaluate.py`)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("safetensors")

from mhqa_graph.errors import ModelError  # noqa: E402
from mhqa_graph.models import adapters  # noqa: E402
from mhqa_graph.models.adapters import ADAPTERS, WEIGHTS, shipped_adapter  # noqa: E402
from mhqa_graph.models.factory import _llamacpp_options  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(adapters, "cache_dir", lambda: tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_a_shipped_adapter_is_written_once_for_llamacpp_with_every_lora_pair(cache, name):
    from safetensors.numpy import load_file

    adapter = ADAPTERS[name]
    path = shipped_adapter(name, adapter.base)
    assert path.parent == cache / "adapters" and path.name.startswith(f"{name}-")
    reader = gguf.GGUFReader(str(path))
    fields = {k: reader.fields[k] for k in ("general.type", "adapter.type", "adapter.lora.alpha")}
    assert bytes(fields["general.type"].parts[-1]).decode() == "adapter"
    settings = json.loads((adapter.folder / "adapter_config.json").read_text())
    assert float(fields["adapter.lora.alpha"].parts[-1][0]) == settings["lora_alpha"]
    peft = load_file(str(adapter.folder / WEIGHTS))
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == len(peft) and all(n.startswith("blk.") and ".weight.lora_" in n for n in tensors)
    layer0 = next(k for k in peft if ".layers.0.self_attn.q_proj.lora_B" in k)
    assert (tensors["blk.0.attn_q.weight.lora_b"].data == peft[layer0]).all()
    stamp = path.stat().st_mtime_ns
    assert shipped_adapter(name, adapter.base) == path and path.stat().st_mtime_ns == stamp  # kept, not rewritten
    ref, options = _llamacpp_options(f"{adapter.base}?lora={name}&threads=1")
    assert ref == adapter.base and options == {"lora_path": str(path), "n_threads": 1}


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_a_shipped_adapter_has_a_model_card_naming_its_files(cache, name):
    """Its README names the base and the training data with their licences, the command and the records, and the
    sha256 of each file shipped and of the llama.cpp adapter written from them (issue 64, 5)."""
    import hashlib
    import re

    adapter = ADAPTERS[name]
    card = (adapter.folder / "README.md").read_text(encoding="utf-8")
    for needed in ("base model", "training data", "licence", "mhqa train", "docs/runs/"):
        assert needed in card, needed
    digests = set(re.findall(r"sha256 `([0-9a-f]{64})`", card))
    files = [adapter.folder / WEIGHTS, adapter.folder / "adapter_config.json", shipped_adapter(name, adapter.base)]
    assert {hashlib.sha256(f.read_bytes()).hexdigest() for f in files} == digests


def test_an_unknown_name_or_another_pack_is_refused(cache):
    with pytest.raises(ModelError, match=r"lora must name a shipped adapter \(omne-pq2h\), got 'omne-typo'; a file "):
        shipped_adapter("omne-typo", "qwen2.5-coder-0.5b")
    for name, adapter in ADAPTERS.items():
        with pytest.raises(ModelError, match=f"trained over {adapter.base}; it cannot be put over 'other'"):
            shipped_adapter(name, "other")
    with pytest.raises(ModelError, match="lora=file: names no file, got 'file:missing.gguf'"):
        _llamacpp_options("qwen2.5-coder-0.5b?lora=file:missing.gguf")


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_a_shipped_adapter_loads_into_its_base_for_training(name):
    pytest.importorskip("peft")
    from mhqa_graph.training.configs import ModelConfig
    from mhqa_graph.training.evaluate import load_adapter
    from mhqa_graph.training.policy import load_model

    from mhqa_graph.models.packs import pack_installed

    adapter = ADAPTERS[name]
    if not pack_installed(adapter.base):
        pytest.skip(f"needs the {adapter.base} pack")
    settings = json.loads((adapter.folder / "adapter_config.json").read_text())
    config = ModelConfig(name=adapter.base, lora_r=settings["r"], lora_alpha=settings["lora_alpha"])
    model, _ = load_model(config)
    load_adapter(model, adapter.folder, config)
    assert any(float(w.detach().abs().sum()) > 0 for n, w in model.named_parameters() if "lora_B" in n)


# -- which adapter files a spec may name, and what is checked before llama.cpp reads one (issue 64, 5) ---------
def test_lora_takes_registry_names_and_paths_only_by_opting_in(tmp_path):
    """A path in `lora=` is refused as any unknown name, with one error whether or not a file is there; a path is
    `lora=file:PATH`, which the caller opts in to (Studio refuses it: tests/test_studio.py)."""
    there = tmp_path / "there.gguf"
    there.write_bytes(b"x")
    errors = []
    for value in (str(there), str(tmp_path / "missing.gguf")):
        with pytest.raises(ModelError) as caught:
            _llamacpp_options(f"qwen2.5-coder-0.5b?lora={value}", write=False)
        errors.append(str(caught.value).replace(value, "PATH"))
    assert errors[0] == errors[1] == ("llamacpp: lora must name a shipped adapter (omne-pq2h), got 'PATH'; a file of "
                                      "your own is lora=file:PATH")
    assert _llamacpp_options(f"qwen2.5-coder-0.5b?lora=file:{there}", write=False)[1] == {"lora_path": str(there)}


def toy_base(path, arch="qwen2"):
    """A GGUF model file with one 4x4 weight, as llama.cpp's writer lays it out."""
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def toy_adapter(path, arch="qwen2", target="blk.0.attn_q.weight", rank=2, inner=4, pair=True):
    import numpy as np

    tensors = {f"{target}.lora_a": np.zeros((rank, inner), dtype=np.float32)}
    if pair:
        tensors[f"{target}.lora_b"] = np.zeros((4, rank), dtype=np.float32)
    return adapters.write_adapter_gguf(path, arch, 8.0, tensors)


def test_an_adapter_file_is_checked_against_the_model_before_llamacpp_reads_it(tmp_path):
    """llama.cpp crashes the process on a file it cannot use as an adapter (a file holding 'x' ended in a
    segmentation fault): the magic, the metadata and the tensors are checked first, each refusal one line."""
    from mhqa_graph.models.adapters import check_adapter_file

    base = toy_base(tmp_path / "base.gguf")
    check_adapter_file(toy_adapter(tmp_path / "good.gguf"), base)
    (tmp_path / "x.gguf").write_bytes(b"x")
    (tmp_path / "torn.gguf").write_bytes(toy_adapter(tmp_path / "whole.gguf").read_bytes()[:40])
    bad = {"x.gguf": "not a GGUF file", "torn.gguf": "the file ends inside its header",
           "base.gguf": "general.type None and adapter.type None, not adapter and lora",
           "llama.gguf": "its architecture is 'llama', the model's 'qwen2'",
           "other.gguf": "its tensor 'blk.9.attn_q.weight.lora_a' adapts no weight of the model",
           "alone.gguf": "its tensor 'blk.0.attn_q.weight.lora_a' has no lora_b beside it",
           "wide.gguf": "the shapes of blk.0.attn_q.weight's lora_a (8, 2) and lora_b (2, 4) do not fit"}
    toy_adapter(tmp_path / "llama.gguf", arch="llama")
    toy_adapter(tmp_path / "other.gguf", target="blk.9.attn_q.weight")
    toy_adapter(tmp_path / "alone.gguf", pair=False)
    toy_adapter(tmp_path / "wide.gguf", inner=8)
    for name, why in bad.items():
        with pytest.raises(ModelError) as caught:
            check_adapter_file(tmp_path / name, base)
        assert why in str(caught.value) and "\n" not in str(caught.value), (name, str(caught.value))


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_a_file_that_is_not_an_adapter_is_one_line_and_exit_2(tmp_path):
    """`mhqa ask` over a model with `lora=file:` naming a file that holds 'x': one line, exit 2, no crash."""
    import subprocess
    import sys

    base = toy_base(tmp_path / "base.gguf")
    (tmp_path / "x").write_bytes(b"x")
    done = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "ask", "q", "--agent", "direct", "--llm",
                           f"llamacpp:{base}?lora=file:{tmp_path / 'x'}"], capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ModelError: ") and "is not a llama.cpp LoRA adapter: not a GGUF file" in lines[0]


REPLIES = Path(__file__).parent / "shipped_adapter_replies.json"  # each adapter's reply, recorded once


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_a_shipped_adapter_loads_into_llamacpp_and_replies_as_recorded(name):
    """The adapter, written for llama.cpp and loaded over its pack, gives the recorded greedy reply, and the base
    model without it another one (so it was applied). ~25 s on one thread (two loads of the 0.5B)."""
    from langchain_core.messages import HumanMessage, SystemMessage

    from mhqa_graph.models.factory import load_chat_model
    from mhqa_graph.models.packs import pack_installed

    pytest.importorskip("llama_cpp")
    adapter = ADAPTERS[name]
    if not pack_installed(adapter.base):
        pytest.skip(f"needs the {adapter.base} pack (pip install 'mhqa-graph[models-qwen]')")
    recorded = json.loads(REPLIES.read_text(encoding="utf-8"))[name]
    messages = [SystemMessage(recorded["system"]), HumanMessage(recorded["question"])]
    replies = {}
    for key, spec in (("reply", f"llamacpp:{adapter.base}?lora={name}&{recorded['options']}"),
                      ("base_reply", f"llamacpp:{adapter.base}?{recorded['options']}")):
        model = load_chat_model(spec, max_new_tokens=recorded["max_new_tokens"], temperature=0.0)
        replies[key] = model.invoke(messages, stop=recorded["stop"]).text
    assert replies == {"reply": recorded["reply"], "base_reply": recorded["base_reply"]}
    assert recorded["reply"] != recorded["base_reply"]
