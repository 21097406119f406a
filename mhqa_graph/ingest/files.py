"""Generic input files: JSON / JSONL records, triples (TSV or JSON) and passages (JSONL).

Readers stream items lazily. A malformed row becomes an `IngestError` naming the file and
line; by default it is raised, with `yield_errors=True` it is yielded in place of the item so
that a caller (see `runner.ingest`) can count it and go on with the next row. A name no store
takes (U+001F, or over `MAX_NAME_BYTES`: see store/base.py) makes its row malformed, so every
backend keeps the same rows.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator
from os import PathLike
from typing import Any, TypeVar

from ..errors import IngestError
from ..store.base import KEY_SEPARATOR, name_too_long
from ..types import Passage, Triple

T = TypeVar("T")
TOO_DEEP = "nested too deeply"  # json raises RecursionError past Python's recursion limit
StrPath = str | PathLike[str]


def passage_id(title: str, text: str) -> str:
    """Stable id of a passage: the first 16 hex digits of sha1(title + "\\n" + text)."""
    return hashlib.sha1(f"{title}\n{text}".encode("utf-8", "surrogatepass")).hexdigest()[:16]  # lone surrogates too


class NameTooLong(ValueError):
    """A name of a row is longer than a store takes (`MAX_NAME_BYTES`)."""


def make_passage(title: str, text: str, id: str | None = None) -> Passage:
    """A passage, its id `passage_id(title, text)` unless given; NameTooLong for an id no store takes."""
    if id and (too_long := name_too_long("passage id", id)):
        raise NameTooLong(too_long)
    return Passage(id=id or passage_id(title, text), title=title, text=text)


def checked(items: Iterable[T | IngestError], yield_errors: bool) -> Iterator[T | IngestError]:
    """Pass items through; raise the first IngestError unless `yield_errors`."""
    for item in items:
        if isinstance(item, IngestError) and not yield_errors:
            raise item
        yield item


def iter_lines(path: StrPath) -> Iterator[tuple[int, str] | IngestError]:
    """(1-based line number, line without its newline) of each non-blank line of a UTF-8 text file."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise IngestError(f"cannot read file: {e.strerror}", str(path)) from None
    with f:
        for n, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield IngestError("not valid UTF-8", str(path), n)
                continue
            text = (text.lstrip("\ufeff") if n == 1 else text).rstrip("\r\n")
            if text.strip():
                yield n, text


def _first_char(path: StrPath) -> str:
    """The first non-space character of the file ("" if there is none)."""
    try:
        with open(path, "rb") as f:
            while chunk := f.read(4096):
                if stripped := chunk.decode("utf-8", "ignore").lstrip("\ufeff \t\r\n"):
                    return stripped[0]
    except OSError as e:
        raise IngestError(f"cannot read file: {e.strerror}", str(path)) from None
    return ""


def iter_json(path: StrPath) -> Iterator[tuple[int, Any] | IngestError]:
    """JSON values of a JSON-list file (numbered by 1-based index) or a JSONL file (by line).

    The format is sniffed from the first non-space character: `[` is a JSON list, unless the
    file turns out to hold one array per line, which is read as JSONL.
    """
    if _first_char(path) == "[":
        try:
            with open(path, encoding="utf-8-sig") as f:
                data = json.load(f)
        except UnicodeDecodeError:
            yield IngestError("not valid UTF-8", str(path))
            return
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":
                yield IngestError(f"invalid JSON: {e.msg}", str(path), e.lineno)
                return
        except ValueError as e:  # an integer longer than Python reads (4,300 digits)
            yield IngestError(f"invalid JSON: {e}", str(path))
            return
        except RecursionError:
            yield IngestError(f"invalid JSON: {TOO_DEEP}", str(path))
            return
        else:
            yield from enumerate(data, 1)
            return
    for item in iter_lines(path):
        if isinstance(item, IngestError):
            yield item
            continue
        n, text = item
        try:
            yield n, json.loads(text)
        except json.JSONDecodeError as e:
            yield IngestError(f"invalid JSON: {e.msg}", str(path), n)
        except ValueError as e:  # an integer longer than Python reads (4,300 digits)
            yield IngestError(f"invalid JSON: {e}", str(path), n)
        except RecursionError:
            yield IngestError(f"invalid JSON: {TOO_DEEP}", str(path), n)


def triple(parts: Any) -> Triple:
    """A validated (subject, relation, object); raises ValueError describing what is wrong."""
    if not isinstance(parts, (list, tuple)) or len(parts) != 3:
        raise ValueError(f"expected [subject, relation, object], got {parts!r:.200}")
    out = []
    for part in parts:
        if isinstance(part, float) and not math.isfinite(part):  # 1e400 is read as inf: no entity
            raise ValueError(f"triple parts must be names, got the number {part!r} in {parts!r:.200}")
        if isinstance(part, (int, float)) and not isinstance(part, bool):
            part = str(part)
        if not isinstance(part, str) or not part.strip():
            raise ValueError(f"triple parts must be non-empty strings, got {parts!r:.200}")
        if KEY_SEPARATOR in part:
            raise ValueError(f"a triple part holds the control character U+001F, which no name may hold: "
                             f"{parts!r:.200}")
        if too_long := name_too_long("triple part", part.strip()):
            raise NameTooLong(too_long)
        out.append(part.strip())
    return out[0], out[1], out[2]


def _json_triple(value: Any) -> Triple:
    if isinstance(value, dict):
        missing = [k for k in ("subject", "relation", "object") if k not in value]
        if missing:
            raise ValueError(f"missing field(s) {', '.join(missing)}")
        value = (value["subject"], value["relation"], value["object"])
    return triple(value)


def _tsv_triples(path: StrPath) -> Iterator[Triple | IngestError]:
    for item in iter_lines(path):
        if isinstance(item, IngestError):
            yield item
            continue
        n, text = item
        try:
            yield triple(text.split("\t"))
        except NameTooLong as e:
            yield IngestError(str(e), str(path), n)
        except ValueError:
            yield IngestError(f"expected 'subject<TAB>relation<TAB>object', got {text!r:.200}", str(path), n)


def _json_triples(path: StrPath) -> Iterator[Triple | IngestError]:
    for item in iter_json(path):
        if isinstance(item, IngestError):
            yield item
            continue
        n, value = item
        try:
            yield _json_triple(value)
        except ValueError as e:
            yield IngestError(str(e), str(path), n)


def read_triples_file(path: StrPath, *, yield_errors: bool = False) -> Iterator[Triple | IngestError]:
    """Triples of a TSV file (`subject<TAB>relation<TAB>object` per line) or of a JSON list / JSONL
    file of `[s, r, o]` arrays or `{"subject", "relation", "object"}` objects. Parts are stripped."""
    source = _json_triples(path) if _first_char(path) in ("[", "{") else _tsv_triples(path)
    return checked(source, yield_errors)


def _json_passages(path: StrPath) -> Iterator[Passage | IngestError]:
    for item in iter_json(path):
        if isinstance(item, IngestError):
            yield item
            continue
        n, row = item
        if not isinstance(row, dict):
            yield IngestError(f"expected a JSON object, got {type(row).__name__}", str(path), n)
            continue
        title, text, id_ = row.get("title", ""), row.get("text"), row.get("id")
        if not isinstance(text, str) or not text.strip():
            yield IngestError("field 'text' must be a non-empty string", str(path), n)
        elif not isinstance(title, str):
            yield IngestError("field 'title' must be a string", str(path), n)
        elif id_ is not None and (isinstance(id_, bool) or not isinstance(id_, (str, int)) or not str(id_).strip()):
            yield IngestError("field 'id' must be a non-empty string or an integer", str(path), n)
        else:
            try:
                yield make_passage(title.strip(), text.strip(), None if id_ is None else str(id_).strip())
            except NameTooLong as e:
                yield IngestError(str(e), str(path), n)


def read_passages_file(path: StrPath, *, yield_errors: bool = False) -> Iterator[Passage | IngestError]:
    """Passages of a JSONL (or JSON list) file of `{"id", "title", "text"}` objects.
    `text` is required; `title` defaults to ""; a missing `id` becomes `passage_id(title, text)`."""
    return checked(_json_passages(path), yield_errors)
