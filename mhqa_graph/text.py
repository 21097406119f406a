"""Text that every file and database can carry: lone surrogates (valid in a JSON escape, `"\\ud800"`,
but not in UTF-8, SQLite or Bolt) become U+FFFD."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """`text` with lone surrogates as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


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
