"""Text that every file and database can carry: lone surrogates (valid in a JSON escape, `"\\ud800"`,
but not in UTF-8, SQLite, ladybug or Bolt) become U+FFFD."""

from __future__ import annotations

import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """`text` with lone surrogates as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def encodable_all(value: Any) -> Any:
    """`value` with `encodable` applied to every string in it (keys, lists, tuples and dicts included)."""
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, dict):
        return {encodable_all(k): encodable_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(encodable_all(v) for v in value)
    return value
