"""The policy: loaded from a chat pack, a folder or a Hugging Face Hub id (LoRA or full, on this process's device),
served to the agent graphs as a chat model (in memory, or through llama.cpp with its adapter), and saved."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from mhqa_graph.errors import InvalidInput, ModelError, ModelNotFound, ModelNotInstalled
from mhqa_graph.models.chat import TransformersChatModel, model_device
from mhqa_graph.paths import expand_user_path, is_dir

from .configs import ModelConfig
from .devices import on_main_process, policy_device, policy_dtype
from .lora_gguf import supports, write_lora_gguf
from .serving import served_policy


def policy_identity(config: ModelConfig) -> dict[str, Any]:
    """What the untrained policy is, for the untrained-run cache: a chat pack by its pinned checksum, a folder by
    its files' sizes and modification times, a Hub id by the snapshot its cache holds, "tiny" by its seed; with
    the dtype. LoRA settings are left out: a fresh adapter (B = 0) leaves the base model's outputs unchanged."""
    from mhqa_graph.models.packs import PACKS

    identity: dict[str, Any] = {"name": config.name, "dtype": str(policy_dtype(config.dtype, policy_device()))}
    if config.name == "tiny":
        return identity | {"seed": config.seed}
    if config.name in PACKS:
        return identity | {"sha256": PACKS[config.name].sha256}
    folder = expand_user_path(config.name)
    if is_dir(folder):
        return identity | {"path": str(folder.resolve()), "files": {
            str(f.relative_to(folder)): [f.stat().st_size, f.stat().st_mtime_ns]
            for f in sorted(folder.rglob("*")) if f.is_file()}}
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(config.name, "config.json")
    except Exception:  # not a Hub id the cache knows: the name alone
        cached = None
    return identity | {"snapshot": Path(cached).parent.name if isinstance(cached, str) else None}


def serves_with_llamacpp(model: Any, config: ModelConfig) -> bool:
    """Whether `policy_chat_model` serves `model` with llama.cpp: always for `inference: llamacpp` (InvalidInput
    if it can't), for "auto" when the policy is a LoRA adapter over a chat pack on the CPU and llama-cpp-python
    is in (a policy on a GPU generates there)."""
    from mhqa_graph.models.packs import PACKS

    if config.inference not in ("auto", "llamacpp", "transformers"):
        raise InvalidInput(f"model.inference must be auto, llamacpp or transformers, got {config.inference!r}")
    possible = (config.lora and config.name in PACKS and supports(model)
                and importlib.util.find_spec("llama_cpp") is not None)
    if config.inference == "llamacpp" and not possible:
        raise InvalidInput("model.inference: llamacpp needs a LoRA policy over a chat pack and "
                           "llama-cpp-python (pip install 'mhqa-graph[llamacpp]')")
    on_cpu = getattr(model_device(model), "type", "cpu") == "cpu"
    return possible and (config.inference == "llamacpp" or (config.inference == "auto" and on_cpu))


def policy_chat_model(model: Any, tokenizer: Any, config: ModelConfig, folder: str | Path,
                      temperature: float = 0.0, max_new_tokens: int = 256, adapter: str | None = None) -> Any:
    """The policy with its current weights as the agents' chat model, for rollouts and dev runs. Served by
    llama.cpp when `serves_with_llamacpp`: the LoRA `adapter` (default: the active one) is written to
    `folder/<adapter>.gguf` and applied over the pack's GGUF (about 10x faster generation on the CPU); else
    by transformers. With `config.rollout_llm` server or openai:, as `serving.served_policy` says."""
    served = served_policy(model, config, folder, {"policy": adapter or getattr(model, "active_adapter", None)},
                           temperature, max_new_tokens)
    if served is not None:
        return served["policy"]
    seed = config.seed if temperature > 0 else None  # sampled calls: seed + n, reproducible
    if not serves_with_llamacpp(model, config):
        return chat_model_for(model, tokenizer, temperature, max_new_tokens, seed=seed)
    path = Path(folder) / f"{adapter or 'adapter'}.gguf"
    on_main_process(lambda: write_lora_gguf(model, path, adapter))
    return llamacpp_policy(config.name, path, temperature, max_new_tokens, seed=seed)


def llamacpp_policy(pack: str, adapter: Path | None, temperature: float, max_new_tokens: int,
                    seed: int | None = None) -> Any:
    """llama.cpp over `pack`'s GGUF with the LoRA `adapter` file (None: the base model); `seed` seeds sampled
    calls (call n: seed + n)."""
    from mhqa_graph.models.factory import load_chat_model

    spec = f"llamacpp:{pack}" + (f"?lora=file:{adapter}" if adapter else "")
    return load_chat_model(spec, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                           model_name=f"{pack}+{adapter.stem}" if adapter else pack)


def hub_offline() -> bool:
    """Whether the Hugging Face Hub may not be asked (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set)."""
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
                                           for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def policy_source(name: str) -> tuple[str, bool]:
    """Where the policy `name` loads from, and whether from local files only: a chat pack's converted folder
    or a local folder; else a Hugging Face Hub id, downloaded into the HF cache (only the cache when
    `hub_offline`). ModelNotFound when `name` can be none of these."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from mhqa_graph.models.packs import PACKS, pack_path

    if name in PACKS:
        return str(pack_path(name)), True
    if is_dir(folder := expand_user_path(name)):
        return str(folder), True
    try:
        validate_repo_id(name)
    except HFValidationError:
        chat = ", ".join(n for n, p in PACKS.items() if p.kind == "chat")
        raise ModelNotFound(f"model {name!r} is neither a chat pack ({chat}), a model folder, nor a Hugging Face "
                            "Hub id (owner/name)") from None
    return name, hub_offline()


def master_dtype(config: ModelConfig, dtype: Any) -> Any:
    """The dtype the trained weights are kept in. A LoRA adapter trains in float32 over a base in `dtype`; full
    fine-tuning keeps float32 master weights (updates of 1e-6 vanish in bfloat16's 8 bits of mantissa), with
    bf16 autocast on a GPU that has it (`devices.precision_args`). A full fine-tuning asked in a half dtype by
    name is refused: `auto` gives float32 masters."""
    import torch

    if config.lora or dtype == torch.float32:
        return dtype
    if config.dtype != "auto":
        raise InvalidInput(f"model.dtype {config.dtype} with lora: false would update {config.dtype} weights "
                           "directly, losing small updates; use dtype auto or float32 (bf16 autocast still applies)")
    return torch.float32


def load_model(config: ModelConfig) -> tuple[Any, Any]:
    """(model, tokenizer) ready to train, on this process's device (`devices.policy_device`) in `config.dtype`:
    wrapped in a PEFT LoRA adapter when `config.lora`."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelNotInstalled(f"training needs torch and transformers ({exc}); "
                                "pip install 'mhqa-graph[train]'") from None
    device = policy_device()
    dtype = master_dtype(config, policy_dtype(config.dtype, device))
    if config.name == "tiny":
        from .tiny import tiny_model_and_tokenizer

        model, tokenizer = tiny_model_and_tokenizer(seed=config.seed)
        model = model.to(device=device, dtype=dtype)
    else:
        source, local = policy_source(config.name)
        torch.manual_seed(config.seed)
        placed = {} if device.type == "cpu" else {"device_map": {"": device}}
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=local, **placed)
        except OSError as exc:
            if Path(source).is_dir():
                raise ModelError(f"cannot load the policy from {source}: {exc}") from exc
            hub = "has no copy in the local cache (HF_HUB_OFFLINE is set)" if local else "gave none"
            raise ModelNotFound(f"model {config.name!r} is not a chat pack or a model folder, and the Hugging Face "
                                f"Hub {hub}: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if config.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha,
                                                 lora_dropout=config.lora_dropout, task_type="CAUSAL_LM",
                                                 target_modules=list(config.target_modules)))
    return model, tokenizer


def chat_model_for(model: Any, tokenizer: Any, temperature: float = 0.0, max_new_tokens: int = 256,
                   name: str = "policy", seed: int | None = None) -> TransformersChatModel:
    """The model under training as a LangChain chat model, for the agents' `llm` / `role_llms`; `seed` seeds
    sampled calls (call n: seed + n)."""
    return TransformersChatModel.from_loaded(model, tokenizer, model_name=name, temperature=temperature,
                                             max_new_tokens=max_new_tokens, seed=seed)


def save_policy(model: Any, tokenizer: Any, path: str | Path) -> str:
    """The weights (or adapters) and the tokenizer saved to `path` by the main process; returns the path."""
    def save() -> None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)

    on_main_process(save)
    return str(path)
