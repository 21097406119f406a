"""GBNF grammars for transformers models, through xgrammar: the same reply formats (`mhqa_graph.replies`)
that llama.cpp enforces, enforced on `generate` by a logits processor that masks the tokens the grammar
does not allow next. transformers runs a caller's processors before its sampling warpers (temperature,
top-k, top-p), so those choose among the allowed tokens.

xgrammar is optional (the `models` and `train` extras install it); without it `available()` is False and
transformers models keep the prompt and the tolerant parser. A grammar is compiled once per tokenizer
(`cache_for`: the agents ask for the same formats on every call, and a trainer makes a chat model per
episode over the same tokenizer) and each call gets a fresh processor.
"""

from __future__ import annotations

import importlib.util
import threading
import weakref
from collections.abc import Callable
from typing import Any

MAX_GRAMMARS = 64  # compiled grammars kept per tokenizer or llama.cpp model (Mujica's differ by ids and counts)

_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> GrammarCache
_caches_lock = threading.Lock()


def remembered(compiled: dict[str, Any], gbnf: str, make: Callable[[str], Any]) -> Any:
    """`make(gbnf)`, kept in `compiled` (at most MAX_GRAMMARS, the oldest dropped first); a ValueError it
    raised is kept too, and raised again, so a bad grammar is parsed once."""
    if gbnf not in compiled:
        if len(compiled) >= MAX_GRAMMARS:
            del compiled[next(iter(compiled))]
        try:
            compiled[gbnf] = make(gbnf)
        except ValueError as exc:
            compiled[gbnf] = exc
    found = compiled[gbnf]
    if isinstance(found, ValueError):
        raise found
    return found


def available() -> bool:
    """Whether xgrammar is installed."""
    return importlib.util.find_spec("xgrammar") is not None


class GrammarCache:
    """Compiled grammars of one tokenizer, keyed by GBNF text; a grammar xgrammar rejects is remembered as
    its ValueError, so it is parsed once. Thread-safe."""

    def __init__(self, tokenizer: Any, vocab_size: int | None = None) -> None:
        import xgrammar as xgr

        self._compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size))
        self._compiled: dict[str, Any] = {}
        self._lock = threading.Lock()

    def processor(self, gbnf: str) -> Any:
        """A fresh logits processor enforcing `gbnf` (one `generate` call's worth); ValueError with xgrammar's
        reason if the grammar does not parse."""
        import xgrammar as xgr

        def compile_one(text: str) -> Any:
            try:
                return self._compiler.compile_grammar(text)
            except RuntimeError as exc:
                raise ValueError(f"xgrammar rejected the grammar: {str(exc).strip()[-300:]}") from None

        with self._lock:
            found = remembered(self._compiled, gbnf, compile_one)
        return xgr.contrib.hf.LogitsProcessor(found)


def cache_for(tokenizer: Any, vocab_size: int | None = None) -> GrammarCache:
    """The GrammarCache of `tokenizer` (made on first use, dropped with the tokenizer); ValueError if xgrammar
    cannot read the tokenizer's vocabulary."""
    with _caches_lock:
        cache = _caches.get(tokenizer)
        if cache is None:
            try:
                cache = GrammarCache(tokenizer, vocab_size)
            except Exception as exc:  # noqa: BLE001 - any failure to read the vocabulary means: no grammar
                raise ValueError(f"xgrammar cannot read the tokenizer: {type(exc).__name__}: {exc}") from exc
            _caches[tokenizer] = cache
        return cache
