"""A LangChain chat model running a local transformers causal LM; its inputs are built on the model's device,
and `grammar=<GBNF text>` constrains a call where xgrammar is installed (`mhqa_graph.models.grammar`)."""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import PrivateAttr

from ..errors import DeviceError, ModelError, ModelNotInstalled
from ..paths import file_sha256
from . import grammar as G
from .call_cache import model_key
from .timeout import ABANDONED, raise_if_abandoned

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
CUT_MARKER = "\n[...]\n"  # stands where a prompt too long for the context window was cut


# what torch says when a model fails on its device or dtype (not on the prompt): two devices, a dtype the
# device has no kernel for, CUDA, cuBLAS or cuDNN errors, no memory left
_DEVICE_FAULT = re.compile(r"device|dtype|scalar type|cuda|cublas|cudnn|nccl|out of memory|not implemented for "
                           r"'(?:Half|BFloat16)'|type \(torch\.[\w.]*Tensor\)", re.IGNORECASE)


def device_fault(exc: BaseException) -> bool:
    """Whether `exc`, raised by a model's forward or generate, is a failure of its device or dtype."""
    return isinstance(exc, RuntimeError) and bool(_DEVICE_FAULT.search(str(exc)))


def model_device(model: Any) -> Any:
    """Where `model`'s inputs go: the device of its input embeddings (also right for a model spread over
    several GPUs, whose first layer takes the ids), else `model.device`; None if it has neither."""
    try:
        return model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError, TypeError):
        return getattr(model, "device", None)


def chat_dicts(messages: list[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages as chat-template dicts ({role, content}); unknown message types count as user."""
    return [{"role": _ROLES.get(m.type, "user"), "content": m.text} for m in messages]


def fit_prompt(ids: list[int], budget: int, keep_head: int = 0,
               marker: list[int] | None = None) -> tuple[list[int], int]:
    """`ids` cut to at most `budget` tokens: the first `keep_head` (the system prompt; at most half the
    budget), then `marker`, then the newest tokens. Returns the ids and how many tokens were dropped."""
    if budget < 1:
        raise ValueError(f"a prompt budget of {budget} tokens leaves no room for the prompt")
    if len(ids) <= budget:
        return list(ids), 0
    head = min(keep_head, budget // 2)
    marker = list(marker or [])
    if budget - head - len(marker) < 1:
        marker = []
    tail = budget - head - len(marker)
    return list(ids[:head]) + marker + list(ids[len(ids) - tail:]), len(ids) - head - tail


def fit_chat(ids: list[int], chat: list[dict[str, str]], window: int | None, max_new: int, name: str,
             system_ids: Callable[[], list[int]], marker_ids: Callable[[], list[int]]) -> tuple[list[int], int]:
    """A templated chat's `ids` cut to fit `window` with `max_new` tokens of reply: the system message
    (`system_ids()`, when the prompt starts with it) and the end of the conversation stay, `marker_ids()`
    stands where the oldest tokens went. Returns the ids and how many tokens were cut; ModelError when
    `max_new` leaves no room. The callables run only when the prompt must be cut."""
    if window is None or len(ids) + max_new <= window:
        return ids, 0
    if window - max_new < 1:
        raise ModelError(f"max_new_tokens={max_new} leaves no room for a prompt in the {window}-token "
                         f"context window of {name}")
    head = 0
    if chat and chat[0]["role"] == "system":
        system = system_ids()
        head = len(system) if ids[:len(system)] == system else 0
    return fit_prompt(ids, window - max_new, head, marker_ids())


def stopping_when(event: threading.Event | None) -> Any:
    """transformers' stopping criteria that end a generation once `event` is set; None without an event."""
    if event is None:
        return None
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Abandoned(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return torch.full((input_ids.shape[0],), event.is_set(), dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([Abandoned()])


def call_seed(model: Any) -> int | None:
    """The sampling seed of `model`'s next call: its `seed` plus the number of calls it made before, so a group of
    samples is not one sample repeated and a run whose calls come one at a time, in one order, repeats; None when
    the model has no seed. The model keeps the count in `_calls` (an itertools.count)."""
    return None if model.seed is None else model.seed + next(model._calls)


@contextmanager
def seeded(seed: int | None, device: Any) -> Iterator[None]:
    """Sampling inside seeded with `seed` (None: as it is), the process's random state left as it was."""
    if seed is None:
        yield
        return
    import torch

    devices = [device] if getattr(device, "type", "cpu") == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class TransformersChatModel(BaseChatModel):
    """Chat over a transformers model folder (or a hub id already in the HF cache). Loads on first use."""

    model_path: str
    model_name: str = ""
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 = greedy
    seed: int | None = None  # sampling: call n samples with seed + n (`call_seed`); None = unseeded
    stop: list[str] | None = None
    dtype: str = "float32"  # stored bf16; float32 matmuls run ~2x faster on most CPUs
    context_window: int = 0  # tokens of prompt + reply; 0 = from the model config

    _model: Any = PrivateAttr(default=None)
    _tokenizer: Any = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _device_fault: str | None = PrivateAttr(default=None)
    _calls: Any = PrivateAttr(default_factory=itertools.count)  # numbers the calls, for `seed`

    @property
    def accepts_grammar(self) -> bool:
        """Whether `grammar=<GBNF text>` constrains a call (`mhqa_graph.replies`): when xgrammar is installed."""
        return G.available()

    @property
    def device_fault(self) -> str | None:
        """The first failure of the model on its device or dtype (see `generate_ids`), None if there was none.
        Such a call raises DeviceError, which an agent graph records as a failed model call; a trainer
        checks this after its rollouts instead of scoring those answers."""
        return self._device_fault

    @property
    def _llm_type(self) -> str:
        return "mhqa-transformers"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self._name, "model_path": self.model_path, "max_new_tokens": self.max_new_tokens,
                "temperature": self.temperature, "seed": self.seed, "dtype": self.dtype,
                "context_window": self.context_window}

    @property
    def _name(self) -> str:
        return self.model_name or Path(self.model_path).name

    def _get_llm_string(self, stop: list[str] | None = None, **kwargs: Any) -> str:
        """The call cache's key of this model (`models.call_cache`): the sha256 of its folder (or its hub id) in
        place of its path."""
        folder = Path(self.model_path)
        return model_key(self._llm_type, {
            "model": file_sha256(folder, remember=True) if folder.exists() else self.model_path,
            "max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "seed": self.seed,
            "dtype": self.dtype, "context_window": self.context_window, "stop_default": self.stop}, stop, kwargs,
            repeatable=not self.temperature)

    @classmethod
    def from_loaded(cls, model: Any, tokenizer: Any, model_name: str = "", **kwargs: Any) -> TransformersChatModel:
        """Chat over a model already in memory (e.g. a PEFT model under training): generation sees its
        current weights. Callers must not train it while a call is running."""
        chat = cls(model_path=getattr(model, "name_or_path", "") or "in-memory", model_name=model_name, **kwargs)
        chat._model, chat._tokenizer = model, tokenizer
        return chat

    def _load(self) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ModelNotInstalled(f"local chat models need torch and transformers ({exc}); "
                                    "pip install 'mhqa-graph[models]'") from None
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, self.dtype),
                                                         local_files_only=True)
        except OSError as exc:
            raise ModelError(f"cannot load chat model {self.model_path!r}: {exc}") from exc
        self._model = model.eval()

    def generate_ids(self, **kwargs: Any) -> Any:
        """`generate(**kwargs)` of the model; a failure of its device or dtype is remembered in `device_fault`
        and raised as DeviceError."""
        try:
            return self._model.generate(**kwargs)
        except RuntimeError as exc:
            if not device_fault(exc):
                raise
            self._device_fault = f"{type(exc).__name__}: {exc}"
            raise DeviceError(f"{self._name} failed on its device or dtype ({model_device(self._model)}): "
                              f"{self._device_fault}") from exc

    def constrained(self, kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, str]]:
        """(logits processors, response metadata) of a call: with `kwargs["grammar"]`, the grammar's processor
        and decoding "grammar"; without one, or when xgrammar rejects the grammar or cannot read the tokenizer
        (the reason goes in `decoding_error`), none and decoding "prompt". Call with the model loaded."""
        if not kwargs.get("grammar") or not self.accepts_grammar:
            return [], {"decoding": "prompt"}
        try:
            cache = G.cache_for(self._tokenizer, getattr(self._model.config, "vocab_size", None))
            return [cache.processor(kwargs["grammar"])], {"decoding": "grammar"}
        except ValueError as exc:  # fall back to the prompt, and say so
            return [], {"decoding": "prompt", "decoding_error": str(exc)}

    def _window(self) -> int | None:
        """The context window: `context_window`, else the smaller of the model's position limit and the
        tokenizer's max length (when set; an unset one is a huge placeholder); None if unknown."""
        if self.context_window > 0:
            return self.context_window
        sizes = [getattr(self._model.config, "max_position_embeddings", None), self._tokenizer.model_max_length]
        sizes = [n for n in sizes if isinstance(n, int) and 0 < n < 10**7]
        return min(sizes) if sizes else None

    def _prompt_ids(self, chat: list[dict[str, str]], max_new: int) -> tuple[list[int], int]:
        """The templated prompt, cut to the context window minus `max_new`: the system message and the
        end of the conversation stay, the oldest tokens after the system message go. Also returns how
        many tokens were cut."""
        tok = self._tokenizer
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"]
        return fit_chat(ids, chat, self._window(), max_new, self._name,
                        lambda: tok.apply_chat_template(chat[:1], return_dict=True)["input_ids"],
                        lambda: tok.encode(CUT_MARKER, add_special_tokens=False))

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        import torch
        from transformers import GenerationConfig

        stops = [s for s in (stop or self.stop or []) if s]
        max_new = int(kwargs.get("max_new_tokens", self.max_new_tokens))
        temperature = float(kwargs.get("temperature", self.temperature))
        chat = chat_dicts(messages)
        abandoned = ABANDONED.get()  # set when a time-limited caller stops waiting: stop at the next token
        with self._lock:
            raise_if_abandoned(abandoned, self._name)
            if self._model is None:
                self._load()
            tok = self._tokenizer
            ids, cut = self._prompt_ids(chat, max_new)
            input_ids = torch.tensor([ids], device=model_device(self._model))
            inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
            pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
            config = GenerationConfig(max_new_tokens=max_new, pad_token_id=pad, stop_strings=stops or None, **sampling)
            processors, decoding = self.constrained(kwargs)
            with torch.inference_mode(), seeded(call_seed(self), model_device(self._model)):
                out = self.generate_ids(**inputs, generation_config=config, logits_processor=processors, tokenizer=tok,
                                        stopping_criteria=stopping_when(abandoned))
            eos = self._model.generation_config.eos_token_id
        n_in = len(ids)
        new = out[0, n_in:].tolist()
        text = tok.decode(new, skip_special_tokens=True)
        eos_ids = set(eos) if isinstance(eos, list) else {eos}
        finish = "length" if len(new) >= max_new and new[-1] not in eos_ids else "stop"
        for s in stops:
            if s in text:
                text, finish = text[:text.index(s)], "stop"
        message = AIMessage(
            content=text,
            usage_metadata={"input_tokens": n_in, "output_tokens": len(new), "total_tokens": n_in + len(new)},
            response_metadata={"model_name": self._name, "finish_reason": finish, "truncated_tokens": cut, **decoding},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])
