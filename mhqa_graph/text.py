"""Text that every file and database can carry: lone surrogates (valid in a JSON escape, `"\\ud800"`,
but not in UTF-8, SQLite or Bolt) become U+FFFD. Answers in the form they are compared in: `normalize_answer`,
the HotpotQA / SQuAD scripts' normalisation (eval/scoring.py scores with it)."""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def encodable(text: str) -> str:
    """`text` with lone surrogates as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def normalize_answer(text: str) -> str:
    """lower -> remove punctuation -> remove articles -> collapse white space (the official order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """`value` with `fn` applied to every string in it (keys, lists, tuples and dicts included)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {map_strings(k, fn): map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_strings(v, fn) for v in value)
    return value


def encodable_all(value: Any) -> Any:
    """`value` with `encodable` applied to every string in it."""
    return map_strings(value, encodable)


def one_line(value: Any, limit: int = 100) -> str:
    """`value` as text on one line, cut to `limit` characters (and "…") when longer."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[:limit] + "…"


MAX_TOPIC_ENTITIES = 20  # an agent is given at most this many topic entities, the first ones
MAX_ENTITY_CHARS = 300  # a longer topic entity is no entity name, and is dropped


def topic_entities(value: Any) -> list[str]:
    """The topic entities an agent is given: of a list, the strings that are non-empty stripped and at most
    MAX_ENTITY_CHARS long (lone surrogates as U+FFFD), the first MAX_TOPIC_ENTITIES of them; anything else
    is dropped."""
    names = [e.strip() for e in value if isinstance(e, str)] if isinstance(value, (list, tuple)) else []
    return [encodable(e) for e in names if 0 < len(e) <= MAX_ENTITY_CHARS][:MAX_TOPIC_ENTITIES]
