"""The LoRA adapter under training as a llama.cpp GGUF adapter, so the policy's rollouts and dev runs go
through llama.cpp over its pack's GGUF: generation about 10x faster than transformers on the CPU.

    path = write_lora_gguf(model, "runs/x/adapter.gguf")          # a PEFT model with a LoRA adapter
    llm = load_chat_model(f"llamacpp:qwen2.5-coder-0.5b?lora=file:{path}")

The file is what llama.cpp's `convert_lora_to_gguf.py` writes: `general.type = adapter`, `adapter.type =
lora`, `adapter.lora.alpha`, and `<base tensor>.lora_a` (r x in) / `.lora_b` (out x r) pairs named after the
base GGUF's tensors; llama.cpp scales B·A by alpha / r as PEFT does. Qwen2 (every qwen2.5 pack) and llama
(smollm2): a llama GGUF holds q and k with the rows of each head permuted (rotary pairs interleaved), as
llama.cpp's converter writes them, so their B matrices get the same row permutation (P·B·A = P·(B·A)).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mhqa_graph.errors import ModelError
from mhqa_graph.models.adapters import gguf_tensor, write_adapter_gguf

ARCHITECTURES = ("qwen2", "llama")  # transformers model_type == GGUF general.architecture


def supports(model: Any, adapter: str | None = None) -> bool:
    """Whether `model` is a PEFT model whose `adapter` (default: the active one) is a plain LoRA adapter over
    an architecture written here."""
    config = getattr(model, "peft_config", {}).get(adapter or getattr(model, "active_adapter", None))
    return (config is not None and getattr(config, "peft_type", None) is not None
            and config.peft_type.value == "LORA" and not config.use_rslora and not config.use_dora
            and getattr(model.config, "model_type", "") in ARCHITECTURES)


def permute_heads(rows: Any, heads: int) -> Any:
    """`rows` (out x anything) with each head's rows reordered as llama.cpp's converter stores a llama q or k
    projection: the head's two halves interleaved row by row."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def adapter_tensors(model: Any, adapter: str | None = None) -> dict[str, Any]:
    """The A and B matrices (float32 numpy) of `adapter` (default: the active one) under their GGUF names."""
    from peft import get_peft_model_state_dict

    config = model.config
    permuted = {"self_attn.q_proj": config.num_attention_heads,
                "self_attn.k_proj": getattr(config, "num_key_value_heads", None) or config.num_attention_heads}
    tensors = {}
    for key, value in get_peft_model_state_dict(model, adapter_name=adapter or model.active_adapter).items():
        name, module, which = gguf_tensor(key)
        tensors[name] = value.detach().float().cpu().numpy()
        if config.model_type == "llama" and which == "B" and module in permuted:
            tensors[name] = permute_heads(tensors[name], permuted[module])
    return tensors


def write_lora_gguf(model: Any, path: str | Path, adapter: str | None = None) -> Path:
    """Write `model`'s LoRA `adapter` (default: the active one) to `path` as a llama.cpp adapter; ModelError
    if it can't be."""
    if not supports(model, adapter):
        raise ModelError("only a plain LoRA adapter over a Qwen2 or llama model can be written as a GGUF "
                         "adapter")
    adapter = adapter or model.active_adapter
    return write_adapter_gguf(Path(path), model.config.model_type, float(model.peft_config[adapter].lora_alpha),
                              adapter_tensors(model, adapter))
