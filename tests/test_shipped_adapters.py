"""The LoRA adapters the project ships (mhqa_graph/models/adapters.py): loadable by name as
`llamacpp:<pack>?lora=<name>`, written once as a llama.cpp adapter from their PEFT weights, refused over another
pack or under an unknown name; and each one's folder loads into its base for training (`training/evaluate.py`)."""

from __future__ import annotations

import json

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


def test_an_unknown_name_or_another_pack_is_refused(cache):
    with pytest.raises(ModelError, match=r"an existing \.gguf file or a shipped adapter \("):
        shipped_adapter("omne-typo", "qwen2.5-coder-0.5b")
    for name, adapter in ADAPTERS.items():
        with pytest.raises(ModelError, match=f"trained over {adapter.base}; it cannot be put over 'other'"):
            shipped_adapter(name, "other")
    with pytest.raises(ModelError, match="lora must name an existing file"):
        _llamacpp_options("qwen2.5-coder-0.5b?lora=missing.gguf")


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
