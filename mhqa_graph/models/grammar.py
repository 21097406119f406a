"""GBNF grammars for transformers models, through xgrammar: the same reply formats (`mhqa_graph.replies`)
that llama.cpp enforces, enforced on `generate` by a logits processor that masks the tokens the grammar
does not allow next.

xgrammar is optional (the `models` extra installs it); without it `available()` is False and transformers
models keep the prompt and the tolerant parser. A grammar is compiled once per model and tokenizer (the
agents ask for the same formats on every call) and each call gets a fresh processor.

transformers applies a caller's logits processors after its own sampling warpers (temperature, top-k,
top-p, min-p), so a top-k that kept only tokens the grammar forbids would leave nothing to sample.
`sampling_after_grammar` moves those warpers behind the grammar's mask.
"""

from __future__ import annotations

import copy
import importlib.util
from typing import Any

MAX_GRAMMARS = 64  # compiled grammars kept per model, as LlamaCppChatModel keeps


def available() -> bool:
    """Whether xgrammar is installed."""
    return importlib.util.find_spec("xgrammar") is not None


class GrammarCache:
    """Compiled grammars of one tokenizer, keyed by GBNF text; a grammar xgrammar rejects is remembered as
    its ValueError, so it is parsed once."""

    def __init__(self, tokenizer: Any, vocab_size: int | None = None) -> None:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xgr.GrammarCompiler(info, max_threads=2)
        self._compiled: dict[str, Any] = {}

    def processor(self, gbnf: str) -> Any:
        """A fresh logits processor enforcing `gbnf` (one `generate` call's worth); ValueError with xgrammar's
        reason if the grammar does not parse."""
        import xgrammar as xgr

        if gbnf not in self._compiled:
            if len(self._compiled) >= MAX_GRAMMARS:
                del self._compiled[next(iter(self._compiled))]
            try:
                self._compiled[gbnf] = self._compiler.compile_grammar(gbnf)
            except RuntimeError as exc:
                self._compiled[gbnf] = ValueError(f"xgrammar rejected the grammar: {str(exc).strip()[-300:]}")
        found = self._compiled[gbnf]
        if isinstance(found, ValueError):
            raise found
        return xgr.contrib.hf.LogitsProcessor(found)


# what transformers' generate uses for a sampling setting that neither the call's nor the model's config sets
_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None}


def sampling_after_grammar(model: Any, config: Any, grammar: Any) -> tuple[Any, list[Any]]:
    """(the generation config to pass to `model.generate`, its logits processors): `config` (None: the
    model's own) with its sampling warpers turned off, and the processors: the grammar's mask, then those
    warpers (temperature, top-k, top-p, min-p; each as `generate` would resolve it: the call's config, else
    the model's, else transformers' default), so that they choose among the tokens the grammar allows."""
    from transformers import (
        GenerationConfig,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    own = getattr(model, "generation_config", None) or GenerationConfig()
    config = copy.deepcopy(config) if config is not None else GenerationConfig()

    def setting(name: str) -> Any:
        for source in (config, own):
            if (value := getattr(source, name, None)) is not None:
                return value
        return _DEFAULTS[name]

    if not setting("do_sample"):
        return config, [grammar]
    processors = [grammar]
    if (temperature := setting("temperature")) != 1.0:
        processors.append(TemperatureLogitsWarper(temperature))
    if top_k := setting("top_k"):
        processors.append(TopKLogitsWarper(top_k))
    if (top_p := setting("top_p")) < 1.0:
        processors.append(TopPLogitsWarper(top_p))
    if min_p := setting("min_p"):
        processors.append(MinPLogitsWarper(min_p))
    config.do_sample, config.temperature, config.top_k, config.top_p, config.min_p = True, 1.0, 0, 1.0, 0.0
    return config, processors
