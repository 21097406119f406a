"""A LangChain chat model running a GGUF file with llama.cpp (llama-cpp-python) on the CPU.

Faster than `TransformersChatModel` on quantized packs: the weights stay Q4, and a call prefills only
what no recent call shared: llama.cpp keeps the KV cache of the previous call, and `prompt_cache_mb` keeps
the states of the calls before it (`prefix_cache.PrefixCache`), restoring the one sharing the longest
prefix. A reply's `usage_metadata["input_token_details"]["cache_read"]` counts the prompt tokens not
prefilled.

Replies repeat: one prompt gives one reply whatever the context or the cache held before. llama.cpp's
arithmetic for a token depends on the batch it was computed in (its kernels are chosen by batch size, and the
rows of a batch are grouped), so a prefix restored from another call and a prefill of the rest would compute
other values than one prefill from the start. A prompt is therefore prefilled in chunks of `prefill_chunk`
tokens counted from its first token, and only whole chunks of an earlier prompt are reused: every token is
computed in the same batch, with the same neighbours, as from an empty context. The last prompt token and
the reply are decoded one at a time, as always.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
import weakref
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import PrivateAttr

from ..errors import ModelError, ModelNotInstalled
from ..paths import file_sha256
from .call_cache import model_key
from .chat import CUT_MARKER, call_seed, chat_dicts, fit_chat
from .grammar import remembered
from .logprobs import TokenLogprobs
from .prefix_cache import PrefixCache, common_prefix
from .timeout import ABANDONED, raise_if_abandoned

DEFAULT_CTX = 8192  # tokens; the KV cache of a model's full training context can take gigabytes
DEFAULT_CACHE_MB = 1024  # qwen2.5-coder-1.5b's KV state takes 28 KB a token: ~18 states of 2,000 tokens
MIN_RESTORE = 16  # tokens a cached state must add to what the context holds to be worth restoring
PREFILL_CHUNK = 64  # tokens per prefill batch, from the prompt's first token: the granularity of reuse


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under `taskset`), else all of them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def stopping_when(event: threading.Event | None) -> Any:
    """llama.cpp's stopping criteria that end a generation once `event` is set; None without an event."""
    if event is None:
        return None
    from llama_cpp import StoppingCriteriaList

    return StoppingCriteriaList([lambda ids, logits: event.is_set()])


def _close(llm: Any) -> None:
    """Free a llama.cpp model. Left to `Llama.__del__` at interpreter exit, freeing fails noisily ("Exception
    ignored in Llama.__del__") once the bindings are torn down."""
    try:
        llm.close()
    except Exception:  # noqa: BLE001 (freeing is best effort)
        pass


def _processors(recorder: TokenLogprobs | None) -> Any:
    """llama.cpp's logits processors for a call: the log-probability recorder, when asked for."""
    if recorder is None:
        return None
    from llama_cpp import LogitsProcessorList

    return LogitsProcessorList([recorder])


class LlamaCppChatModel(BaseChatModel):
    """Chat over a GGUF file with its own chat template. Loads on first use; one call at a time."""

    model_path: str
    model_name: str = ""
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 = greedy
    seed: int | None = None  # sampling: call n samples with seed + n (`chat.call_seed`); None = unseeded
    stop: list[str] | None = None
    n_ctx: int = 0  # tokens of prompt + reply; 0 = the smaller of DEFAULT_CTX and the model's training context
    n_threads: int = 0  # 0 = every core this process may use
    lora_path: str = ""  # a llama.cpp LoRA adapter (.gguf) applied over the model, e.g. a policy under training
    prompt_cache_mb: int = DEFAULT_CACHE_MB  # KV states of recent calls kept to restore prompt prefixes; 0 = off
    prefill_chunk: int = PREFILL_CHUNK  # prefill batch from the prompt's start (module docstring); 0 = llama.cpp's
    # own batching from wherever a reused prefix ends (faster reuse, replies that depend on what ran before)

    _llm: Any = PrivateAttr(default=None)
    _window: int = PrivateAttr(default=0)  # as opened: llama.cpp pads its own n_ctx() up to a multiple of 256
    _template: Any = PrivateAttr(default=None)  # renders a chat with the generation prompt
    _head_template: Any = PrivateAttr(default=None)  # renders the system message alone
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _grammars: dict[str, Any] = PrivateAttr(default_factory=dict)  # GBNF text -> LlamaGrammar, or the parse error
    _cache: PrefixCache | None = PrivateAttr(default=None)
    _calls: Any = PrivateAttr(default_factory=itertools.count)  # numbers the calls, for `seed`
    _whole: int = PrivateAttr(default=0)  # leading context tokens prefilled in whole chunks (reusable as they are)

    accepts_grammar: ClassVar[bool] = True  # `grammar=<GBNF text>` constrains a call (mhqa_graph.replies)
    accepts_logprobs: ClassVar[bool] = True  # `logprobs=True`: the reply's token log-probabilities (models.logprobs)

    @property
    def _llm_type(self) -> str:
        return "mhqa-llamacpp"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self._name, "model_path": self.model_path, "max_new_tokens": self.max_new_tokens,
                "temperature": self.temperature, "seed": self.seed, "n_ctx": self.n_ctx, "n_threads": self.n_threads,
                "lora_path": self.lora_path, "prompt_cache_mb": self.prompt_cache_mb,
                "prefill_chunk": self.prefill_chunk}

    @property
    def _name(self) -> str:
        return self.model_name or Path(self.model_path).stem

    def _get_llm_string(self, stop: list[str] | None = None, **kwargs: Any) -> str:
        """The call cache's key of this model (`models.call_cache`): the model file's and adapter's sha256 in place
        of their paths; threads and the prompt cache, which choose how a reply is computed, left out."""
        return model_key(self._llm_type, {
            "model": file_sha256(self.model_path, remember=True),
            "lora": file_sha256(self.lora_path, remember=True) if self.lora_path else "",
            "max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "seed": self.seed,
            "n_ctx": self.n_ctx, "stop_default": self.stop}, stop, kwargs, repeatable=not self.temperature)

    def _open(self, n_ctx: int) -> Any:
        from llama_cpp import Llama

        threads = self.n_threads or usable_cores()
        try:
            return Llama(model_path=self.model_path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         lora_path=self.lora_path or None, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"cannot load GGUF model {self.model_path!r}: {exc}") from exc

    def _load(self) -> None:
        try:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        except ImportError as exc:
            raise ModelNotInstalled(f"llamacpp: models need llama-cpp-python ({exc}); "
                                    "pip install 'mhqa-graph[llamacpp]'") from None
        if not Path(self.model_path).is_file():
            raise ModelError(f"no GGUF file at {self.model_path!r}")
        if self.lora_path and not Path(self.lora_path).is_file():
            raise ModelError(f"no LoRA adapter file at {self.lora_path!r}")
        window = self.n_ctx or DEFAULT_CTX
        llm = self._open(window)
        meta = llm.metadata
        trained = int(meta.get(f"{meta.get('general.architecture')}.context_length", 0) or 0)
        if not self.n_ctx and 0 < trained < window:
            window = trained
            llm = self._open(window)
        template = meta.get("tokenizer.chat_template")
        if not template:
            raise ModelError(f"{self._name}: the GGUF file has no chat template")
        eos, bos = llm.token_eos(), llm.token_bos()
        eos_text = llm.detokenize([eos], special=True).decode("utf-8", "replace") if eos != -1 else ""
        bos_text = llm.detokenize([bos], special=True).decode("utf-8", "replace") if bos != -1 else ""
        self._template = Jinja2ChatFormatter(template, eos_text, bos_text)
        self._head_template = Jinja2ChatFormatter(template, eos_text, bos_text, add_generation_prompt=False)
        self._llm, self._window = llm, window
        weakref.finalize(self, _close, llm)  # at the latest at exit, while llama.cpp's bindings are still loaded
        self._cache = PrefixCache(self.prompt_cache_mb << 20) if self.prompt_cache_mb > 0 else None

    def _restore(self, ids: list[int]) -> tuple[int, bool]:
        """Load the cached state sharing the longest prefix with `ids` if it shares at least MIN_RESTORE more
        tokens than the context holds; returns how many prompt tokens need no prefill, and whether a cached
        state failed to load (llama.cpp refused it: the prompt is then prefilled in full and the entry dropped).
        With `prefill_chunk`, only whole chunks count, of the context and of a cached state."""
        from llama_cpp import llama_cpp as api

        llm, chunk = self._llm, self.prefill_chunk
        body = len(ids) - 1  # llama.cpp evaluates the last prompt token again for its logits

        def whole(n: int) -> int:
            return n // chunk * chunk if chunk else n

        held = whole(min(common_prefix(llm.input_ids[:self._whole if chunk else llm.n_tokens].tolist(), ids), body))
        found = self._cache.longest(ids) if self._cache is not None else None
        failed = False
        if found and whole(min(found[2], body)) >= held + MIN_RESTORE:
            tokens, state, shared = found
            llm._ctx.kv_cache_seq_rm(-1, 0, -1)
            if api.llama_state_seq_set_data(llm._ctx.ctx, (ctypes.c_uint8 * len(state)).from_buffer(state),
                                            len(state), 0):
                held = whole(min(shared, body))
                llm.input_ids[:len(tokens)] = tokens
                llm.n_tokens, llm._requires_eval = len(tokens), True
            else:  # nothing usable is left in the context
                llm.reset()
                self._cache.drop(tokens)
                held, failed = 0, True
        if chunk:
            self._prefill(ids[:body], held)
        return held, failed

    def _prefill(self, body: list[int], held: int) -> None:
        """Evaluate `body` after the `held` tokens the context keeps, in chunks of `prefill_chunk` counted from the
        prompt's first token, and keep the state of its whole chunks in the prefix cache."""
        llm, chunk = self._llm, self.prefill_chunk
        llm.n_tokens = held  # `eval` drops what the context held beyond
        llm._ctx.kv_cache_seq_rm(-1, held, -1)
        self._whole = len(body) // chunk * chunk
        for start in range(held, len(body), chunk):
            if start == self._whole > held:  # the new whole chunks are in: keep them, before the partial one
                self._save()
            llm.eval(body[start:start + chunk])
        if self._whole == len(body) > held:
            self._save()

    def _save(self) -> None:
        """Keep the context's state in the prefix cache, under the tokens it holds (with `prefill_chunk`, the prompt's
        whole chunks; without, the prompt and reply just run)."""
        from llama_cpp import llama_cpp as api

        llm = self._llm
        if self._cache is None or not llm.n_tokens:
            return
        size = api.llama_state_seq_get_size(llm._ctx.ctx, 0)
        if size > self._cache.capacity:
            return
        state = bytearray(size)  # restored in place later (ctypes from_buffer), so copied once only
        written = api.llama_state_seq_get_data(llm._ctx.ctx, (ctypes.c_uint8 * size).from_buffer(state), size, 0)
        self._cache.put(llm.input_ids[:llm.n_tokens].tolist(), state[:written] if written < size else state)

    def forget(self) -> None:
        """Empty the context and the prefix cache: the next call prefills its prompt from nothing."""
        with self._lock:
            if self._llm is not None:
                self._llm.reset()
                self._llm._ctx.kv_cache_seq_rm(-1, 0, -1)
            self._whole = 0
            if self._cache is not None:
                self._cache = PrefixCache(self._cache.capacity)

    def _tokens(self, formatter: Any, chat: list[dict[str, str]]) -> list[int]:
        text = formatter(messages=chat).prompt
        return self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def _prompt_ids(self, chat: list[dict[str, str]], max_new: int) -> tuple[list[int], int]:
        """The templated prompt, cut to the context window minus `max_new` like `TransformersChatModel`
        does: the system message and the end of the conversation stay. Also returns the tokens cut."""
        return fit_chat(self._tokens(self._template, chat), chat, self._window, max_new, self._name,
                        lambda: self._tokens(self._head_template, chat[:1]),
                        lambda: self._llm.tokenize(CUT_MARKER.encode("utf-8"), add_bos=False, special=False))

    def _grammar(self, text: str) -> Any:
        """The LlamaGrammar of GBNF `text`, checked once: llama.cpp's parser must accept it (a grammar it
        rejects would crash the sampler), else ValueError with the reason."""
        from llama_cpp import llama_cpp as api
        from llama_cpp.llama_grammar import LlamaGrammar

        def check(gbnf: str) -> Any:
            sampler = api.llama_sampler_init_grammar(self._llm._model.vocab, gbnf.encode("utf-8"), b"root")
            if not sampler:
                raise ValueError("llama.cpp rejected the grammar")
            api.llama_sampler_free(sampler)
            return LlamaGrammar.from_string(gbnf, verbose=False)

        return remembered(self._grammars, text, check)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        stops = [s for s in (stop or self.stop or []) if s]
        max_new = int(kwargs.get("max_new_tokens", self.max_new_tokens))
        temperature = float(kwargs.get("temperature", self.temperature))
        chat = chat_dicts(messages)
        decoding: dict[str, Any] = {"decoding": "prompt"}
        abandoned = ABANDONED.get()  # set when a time-limited caller stops waiting: stop at the next token
        with self._lock:
            raise_if_abandoned(abandoned, self._name)
            if self._llm is None:
                self._load()
            ids, cut = self._prompt_ids(chat, max_new)
            grammar = None
            if kwargs.get("grammar"):
                try:
                    grammar, decoding = self._grammar(kwargs["grammar"]), {"decoding": "grammar"}
                except ValueError as exc:  # fall back to the prompt, and say so
                    decoding["decoding_error"] = str(exc)
            try:
                reused, failed = self._restore(ids)
                cache_error = {"cache_error": "llama.cpp refused a cached state; the prompt was prefilled in full"} \
                    if failed else {}
                recorder = TokenLogprobs() if kwargs.get("logprobs") else None
                out = self._llm.create_completion(prompt=ids, max_tokens=max_new, temperature=temperature,
                                                  stop=stops or None, grammar=grammar, seed=call_seed(self),
                                                  stopping_criteria=stopping_when(abandoned),
                                                  logits_processor=_processors(recorder))
                if not self.prefill_chunk:  # else `_restore` kept the prompt's whole chunks
                    self._save()
                scored = {} if recorder is None else {
                    "logprobs": {"content": recorder.content(lambda i: self._llm.detokenize([i]))}}
            except (ValueError, RuntimeError) as exc:
                raise ModelError(f"{self._name}: llama.cpp failed: {exc}") from exc
        choice, usage = out["choices"][0], out["usage"]
        n_in, n_out = usage["prompt_tokens"], usage["completion_tokens"]
        message = AIMessage(
            content=choice["text"],
            usage_metadata={"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out,
                            "input_token_details": {"cache_read": reused}},
            response_metadata={"model_name": self._name, "finish_reason": choice["finish_reason"] or "stop",
                               "truncated_tokens": cut, **decoding, **cache_error, **scored},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])
