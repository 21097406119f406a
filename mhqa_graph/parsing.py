"""Tolerant parsing of what small models write: JSON somewhere in prose, tags, think blocks."""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
MAX_JSON_CHARS = 20_000  # a reply longer than this is not a JSON answer worth scanning
MAX_STARTS = 32  # brackets tried as the start of a JSON value: bounds the scan to linear time


def words(text: str) -> str:
    """`text` as lower-case words joined by single spaces (punctuation dropped): how answers, entity
    names and fact lines are compared with each other."""
    return " ".join(re.findall(r"\w+", text.lower()))


def strip_think(text: str) -> str:
    """`text` without <think>…</think> blocks (an unclosed block runs to the end)."""
    return _THINK.sub("", text).strip()


def think_text(text: str) -> str:
    """The contents of the <think> blocks of `text`, joined."""
    return "\n".join(m.strip() for m in _THINK.findall(text)).strip()


def extract_tag(text: str, tag: str) -> str | None:
    """The contents of the last <tag>…</tag> in `text` (closing tag optional at the end)."""
    found = re.findall(rf"<{tag}>(.*?)(?:</{tag}>|$)", text, re.DOTALL | re.IGNORECASE)
    return found[-1].strip() if found else None


_ANSWER_IS = re.compile(r"(?:final answer|the answer is|answer)\s*(?:is)?\s*[:：]\s*(.+)", re.IGNORECASE)


def final_answer(text: str) -> str:
    """The answer a reply gives: a non-empty <answer> tag; else the last "the answer is: X" /
    "Answer: X" line, even inside an unclosed <think>; else the reply without think blocks."""
    tagged = extract_tag(text, "answer")
    if tagged:
        return tagged
    stated = _ANSWER_IS.findall(re.sub(r"</?answer>", " ", text))
    if stated and stated[-1].strip():
        return stated[-1].strip()
    return strip_think(re.sub(r"<answer>\s*</answer>", "", text))


def _scan(text: str, start: int) -> tuple[int | None, list[str], int | None]:
    """Walk the bracketed value starting at `start`, respecting strings. Returns (index of the
    closing bracket or None, closers still open, index of the opening quote of an unfinished string
    or None); a mismatched bracket gives (None, [], None)."""
    pairs = {"{": "}", "[": "]"}
    stack: list[str] = []
    quote: int | None = None
    escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quote = None
        elif ch == '"':
            quote = i
        elif ch in pairs:
            stack.append(pairs[ch])
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return None, [], None
            if not stack:
                return i, [], None
    return None, stack, quote


def _balanced(text: str, start: int) -> str | None:
    """The bracketed span starting at `start`; None if it never closes."""
    end, _, _ = _scan(text, start)
    return text[start:end + 1] if end is not None else None


def close_json(text: str, finished: bool = False) -> str:
    """The JSON value starting at the first bracket of `text`, with the closing quote and brackets
    a truncated reply is missing appended (small models stop early). `finished`: cut back to before a
    string it did not finish instead, keeping the items it completed (a reply that ran out of tokens in a
    list of strings, as a small model repeating itself does)."""
    start = next((i for i, ch in enumerate(text) if ch in "{["), None)
    if start is None:
        return text
    end, stack, quote = _scan(text, start)
    if end is not None:
        return text[start:end + 1]
    closers = "".join(reversed(stack))
    if not finished:
        return text[start:] + ('"' if quote is not None else "") + closers
    body = text[start:quote] if quote is not None else text[start:]
    return body.rstrip().rstrip(",").rstrip() + closers


def _loads(candidate: str) -> Any:
    for attempt in (candidate, _TRAILING_COMMA.sub(r"\1", candidate)):
        try:
            return json.loads(attempt)
        except (json.JSONDecodeError, RecursionError):
            continue
    try:  # single-quoted pseudo-JSON, as small models often write
        import ast

        return ast.literal_eval(candidate)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # TypeError: {{...}} is a set of dicts
        return None


def extract_json(text: str, want: type | tuple[type, ...] = (dict, list)) -> Any | None:
    """The first JSON value of type `want` in `text`: fenced blocks first, then any balanced
    {...} or [...] span. None when there is none. Think blocks are skipped, except a block that ends the
    reply when nothing outside the blocks is JSON: a reply that forgot "</think>", or wrote its JSON
    just before it, gives the last JSON value written inside that block."""
    found = _first_json(strip_think(text)[:MAX_JSON_CHARS], want)
    if found is None and (block := _closing_think(text)):
        return _last_json(block[-MAX_JSON_CHARS:], want)
    return found


def _first_json(text: str, want: type | tuple[type, ...]) -> Any | None:
    candidates = [m.strip() for m in _FENCE.findall(text)] + [text.strip()]
    for chunk in candidates:
        value = _loads(chunk)
        if isinstance(value, want):
            return value
        for i in [i for i, ch in enumerate(chunk) if ch in "{["][:MAX_STARTS]:
            span = _balanced(chunk, i)
            if span is not None and isinstance(value := _loads(span), want):
                return value
    return None


def _last_json(text: str, want: type | tuple[type, ...]) -> Any | None:
    """The outermost of the JSON values of type `want` that end last in `text` (the last `MAX_STARTS`
    brackets are tried as starts)."""
    starts = [i for i, ch in enumerate(text) if ch in "{["][-MAX_STARTS:]
    end, best = -1, None
    for i in reversed(starts):  # a start further left that ends no earlier is the value around the last one
        span = _balanced(text, i)
        if span is not None and i + len(span) >= end and isinstance(value := _loads(span), want):
            end, best = i + len(span), value
    return best


def _closing_think(text: str) -> str:
    """The contents of the last think block (as `strip_think` finds them) when only whitespace follows it:
    a block never closed, or closed at the end of `text`; else ""."""
    last = next(reversed(list(_THINK.finditer(text))), None)
    return last.group(1) if last and not text[last.end():].strip() else ""


def json_spans(text: str, want: type | tuple[type, ...] = (dict, list)) -> list[tuple[int, int, Any]]:
    """Every top-level JSON value of type `want` in `text`, as (start, end, value), in order and not
    overlapping; the scan is bounded like `extract_json`'s."""
    out: list[tuple[int, int, Any]] = []
    i, tried, limit = 0, 0, min(len(text), MAX_JSON_CHARS)
    while i < limit and tried < MAX_STARTS:
        if text[i] not in "{[":
            i += 1
            continue
        tried += 1
        span = _balanced(text, i)
        value = _loads(span) if span is not None else None
        if span is not None and isinstance(value, want):
            out.append((i, i + len(span), value))
            i += len(span)
        else:
            i += 1
    return out
