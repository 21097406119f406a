"""A LoRA policy written as a llama.cpp GGUF adapter, and which backend serves the policy's rollouts."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("peft")
gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

from mhqa_graph.training import policy  # noqa: E402
from mhqa_graph.training.configs import ModelConfig  # noqa: E402
from mhqa_graph.training.lora_gguf import permute_heads, write_lora_gguf  # noqa: E402
from mhqa_graph.training.policy import load_model, policy_chat_model, serves_with_llamacpp  # noqa: E402

from mhqa_graph.errors import InvalidInput, ModelError  # noqa: E402
from mhqa_graph.models.chat import TransformersChatModel  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model(ModelConfig(name="tiny", lora_r=4, lora_alpha=8))
    with torch.no_grad():  # B starts at 0; give it values so A and B can't be confused
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return model, tokenizer


def test_the_adapter_file_holds_every_lora_pair_under_its_gguf_name(tiny, tmp_path):
    model, _ = tiny
    path = write_lora_gguf(model, tmp_path / "a" / "adapter.gguf")
    reader = gguf.GGUFReader(str(path))
    fields = {name: f.contents() for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    assert fields["general.type"] == "adapter" and fields["adapter.type"] == "lora"
    assert fields["general.architecture"] == "qwen2" and fields["adapter.lora.alpha"] == pytest.approx(8.0)
    tensors = {t.name: t for t in reader.tensors}
    layers = model.config.num_hidden_layers
    assert len(tensors) == layers * 7 * 2
    layer0 = model.base_model.model.model.layers[0]
    q = layer0.self_attn.q_proj
    a, b = tensors["blk.0.attn_q.weight.lora_a"], tensors["blk.0.attn_q.weight.lora_b"]
    # numpy layout (r, in) and (out, r): llama.cpp's ne is the reverse, [in, r] and [r, out]
    assert a.data.shape == (4, q.in_features) and b.data.shape == (q.out_features, 4)
    assert (a.data == q.lora_A["default"].weight.detach().numpy()).all()
    assert (b.data == q.lora_B["default"].weight.detach().numpy()).all()
    down = tensors["blk.0.ffn_down.weight.lora_b"]
    assert (down.data == layer0.mlp.down_proj.lora_B["default"].weight.detach().numpy()).all()


def test_only_plain_lora_over_qwen2_is_written(tmp_path):
    full, _ = load_model(ModelConfig(name="tiny", lora=False))
    with pytest.raises(ModelError, match="plain LoRA adapter over a Qwen2 or llama"):
        write_lora_gguf(full, tmp_path / "adapter.gguf")


def test_the_policy_is_served_by_transformers_unless_llamacpp_can(tiny, tmp_path):
    model, tokenizer = tiny
    assert not serves_with_llamacpp(model, ModelConfig(name="tiny"))  # not a pack: auto falls back
    llm = policy_chat_model(model, tokenizer, ModelConfig(name="tiny"), tmp_path)
    assert isinstance(llm, TransformersChatModel) and not (tmp_path / "adapter.gguf").exists()
    with pytest.raises(InvalidInput, match="llamacpp needs a LoRA policy over a chat pack"):
        serves_with_llamacpp(model, ModelConfig(name="tiny", inference="llamacpp"))
    with pytest.raises(InvalidInput, match="auto, llamacpp or transformers"):
        serves_with_llamacpp(model, ModelConfig(name="tiny", inference="vllm"))


def test_a_pack_policy_gets_its_adapter_written_and_llamacpp(tiny, tmp_path, monkeypatch):
    model, tokenizer = tiny
    seen = {}

    def load_chat_model(spec, **kwargs):
        seen.update(spec=spec, **kwargs)
        return "llamacpp model"

    monkeypatch.setattr("mhqa_graph.models.factory.load_chat_model", load_chat_model)
    monkeypatch.setattr(policy.importlib.util, "find_spec", lambda name, *a: object())  # as if installed
    config = ModelConfig(name="qwen2.5-coder-0.5b")
    assert policy_chat_model(model, tokenizer, config, tmp_path, 0.7, 99) == "llamacpp model"
    assert seen["spec"] == f"llamacpp:qwen2.5-coder-0.5b?lora=file:{tmp_path / 'adapter.gguf'}"
    assert (seen["temperature"], seen["max_new_tokens"]) == (0.7, 99) and (tmp_path / "adapter.gguf").is_file()
    config.inference = "transformers"
    assert isinstance(policy_chat_model(model, tokenizer, config, tmp_path / "t"), TransformersChatModel)


def test_a_llama_adapter_gets_q_and_k_rows_in_the_gguf_head_order(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2))
    model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "k_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    tensors = {t.name: t.data for t in gguf.GGUFReader(str(write_lora_gguf(model, tmp_path / "a.gguf"))).tensors}
    attn = model.base_model.model.model.layers[0].self_attn
    for name, module, heads in (("attn_q", attn.q_proj, 4), ("attn_k", attn.k_proj, 2), ("attn_v", attn.v_proj, 0)):
        a, b = (getattr(module, f"lora_{x}")["default"].weight.detach().numpy() for x in "AB")
        assert (tensors[f"blk.0.{name}.weight.lora_a"] == a).all()
        assert (tensors[f"blk.0.{name}.weight.lora_b"] == (permute_heads(b, heads) if heads else b)).all()


def test_the_head_order_is_the_one_of_the_smollm2_packs_gguf():
    """llama.cpp's converter stored the pack's q and k permuted: its dequantized weights are the transformers
    weights in `permute_heads` order (and far from them unpermuted)."""
    from gguf.quants import dequantize
    from safetensors import safe_open

    from mhqa_graph.models.packs import gguf_path, pack_installed, pack_path

    if not pack_installed("smollm2-135m"):
        pytest.skip("needs the smollm2-135m pack (extra models)")
    stored = {t.name: t for t in gguf.GGUFReader(str(gguf_path("smollm2-135m"))).tensors}
    folder = pack_path("smollm2-135m")
    config = json.loads((folder / "config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        for name, module, heads in (("attn_q", "q_proj", config["num_attention_heads"]),
                                    ("attn_k", "k_proj", config["num_key_value_heads"])):
            hf = weights.get_tensor(f"model.layers.0.self_attn.{module}.weight").float().numpy()
            tensor = stored[f"blk.0.{name}.weight"]
            gg = dequantize(tensor.data, tensor.tensor_type)
            assert abs(gg - permute_heads(hf, heads)).mean() < 0.01 < abs(gg - hf).mean()
