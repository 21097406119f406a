"""Readers for the four benchmark datasets: pooled passages, knowledge-graph triples and questions.

- hotpotqa: JSON list or JSONL, Hugging Face layout (`context: {title: [...], sentences: [[...]]}`)
  or the original layout (`context: [[title, [sentence, ...]], ...]`). Passages only.
- 2wiki: 2WikiMultihopQA, original layout. Passages from `context` and triples from
  `evidences` of every row; a row without one of these fields offers nothing of that kind.
- musique: JSONL, `paragraphs: [{idx, title, paragraph_text, is_supporting}]`. Passages only.
- pathquestion: a KB file (`subject<TAB>relation<TAB>object`) or a question file
  (`question<TAB>answer(alt1/alt2)<TAB>path`), whose KB is found next to it. Triples only.

Passages are deduplicated by `passage_id(title, text)`, so equal paragraphs of different rows
collapse and ingesting a file twice adds nothing. With `yield_errors=True` a malformed row is
yielded as an `IngestError` instead of being raised.

PathQuestion names (entities and relations) are underscored (`ludwig_ii_of_bavaria`,
`place_of_birth`). They are stored in readable form, underscores turned into spaces
(`ludwig ii of bavaria`, `place of birth`), so that they read naturally in prompts and match
questions and answers word by word. No original name contains a space, so the mapping is a
bijection: `pathquestion_original` gives back the name of the file. Questions and answers are
converted the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import IngestError, InvalidInput
from ..types import Passage, Triple
from .files import StrPath, checked, iter_json, iter_lines, make_passage, read_triples_file, triple

DATASETS = ("hotpotqa", "2wiki", "musique", "pathquestion")

T = TypeVar("T")


@dataclass(frozen=True)
class QAItem:
    """One question with its gold answers and, where the dataset has them, gold evidence.

    `hops` is the number of gold steps: 2 for HotpotQA, the evidence triples for 2Wiki, the
    sub-questions for MuSiQue, the path's relations for PathQuestion. `supporting_ids` are the
    passage ids (as ingested) of the supporting paragraphs.
    """

    id: str
    question: str
    answers: tuple[str, ...]
    type: str | None = None
    level: str | None = None
    hops: int | None = None
    supporting_titles: tuple[str, ...] = ()
    supporting_ids: tuple[str, ...] = ()
    topic_entities: tuple[str, ...] = ()


def pathquestion_name(original: str) -> str:
    """`ludwig_ii_of_bavaria` -> `ludwig ii of bavaria` (the form stored in the graph)."""
    return original.replace("_", " ")


def pathquestion_original(readable: str) -> str:
    """`ludwig ii of bavaria` -> `ludwig_ii_of_bavaria` (the form of the PathQuestion files)."""
    return readable.replace(" ", "_")


def _dataset(dataset: str) -> str:
    if dataset not in DATASETS:
        raise InvalidInput(f"dataset must be one of {DATASETS}, got {dataset!r}")
    return dataset


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x for x in items if x))


# -- JSON rows -------------------------------------------------------------------------------


def read_rows(path: StrPath, *, yield_errors: bool = False) -> Iterator[tuple[int, dict] | IngestError]:
    """(line, row) of a JSON-list file (1-based record index as the line) or a JSONL file."""

    def rows() -> Iterator[tuple[int, dict] | IngestError]:
        for item in iter_json(path):
            if not isinstance(item, IngestError) and not isinstance(item[1], dict):
                item = IngestError(f"expected a JSON object, got {type(item[1]).__name__}", str(path), item[0])
            yield item

    return checked(rows(), yield_errors)


def _per_row(path: StrPath, parse: Callable[[dict], list[T]]) -> Iterator[list[T] | IngestError]:
    """parse(row) for every row; a row it cannot parse becomes an IngestError at its line."""
    for item in read_rows(path, yield_errors=True):
        if isinstance(item, IngestError):
            yield item
            continue
        line, row = item
        try:
            yield parse(row)
        except KeyError as e:
            yield IngestError(f"missing field {e.args[0]!r}", str(path), line)
        except (TypeError, ValueError, AttributeError) as e:
            yield IngestError(f"malformed row: {e}", str(path), line)


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _context(ctx: Any) -> list[tuple[str, list[str]]]:
    """(title, sentences) pairs of a HotpotQA / 2Wiki context, in either layout."""
    if isinstance(ctx, dict):
        titles, sentences = ctx["title"], ctx["sentences"]
        if not isinstance(titles, list) or not isinstance(sentences, list) or len(titles) != len(sentences):
            raise ValueError("context.title and context.sentences must be lists of equal length")
        pairs = list(zip(titles, sentences, strict=True))
    elif isinstance(ctx, list):
        if not all(isinstance(p, list) and len(p) == 2 for p in ctx):
            raise ValueError("context must be a list of [title, [sentences]]")
        pairs = [(p[0], p[1]) for p in ctx]
    else:
        raise ValueError(f"context must be a list or an object, got {type(ctx).__name__}")
    out = []
    for title, sents in pairs:
        if not isinstance(sents, list):
            raise ValueError("the sentences of a context paragraph must be a list")
        out.append((_str(title, "a context title").strip(), [_str(s, "a sentence") for s in sents]))
    return out


# HotpotQA sentences carry their own leading spaces (" They play ..."), so "" restores the
# original paragraph; 2Wiki sentences have none and are joined with " ".
_JOIN = {"hotpotqa": "", "2wiki": " "}


def _context_passages(dataset: str, row: dict) -> list[Passage]:
    if dataset == "2wiki" and "context" not in row:
        return []
    out = []
    for title, sents in _context(row["context"]):
        text = _JOIN[dataset].join(sents).strip()
        if text:
            out.append(make_passage(title, text))
    return out


def _musique_passages(row: dict) -> list[Passage]:
    paragraphs = row["paragraphs"]
    if not isinstance(paragraphs, list) or not all(isinstance(p, dict) for p in paragraphs):
        raise ValueError("paragraphs must be a list of objects")
    out = []
    for p in paragraphs:
        text = _str(p["paragraph_text"], "paragraph_text").strip()
        if text:
            out.append(make_passage(_str(p.get("title", ""), "title").strip(), text))
    return out


def _row_passages(dataset: str) -> Callable[[dict], list[Passage]]:
    if dataset == "musique":
        return _musique_passages
    return lambda row: _context_passages(dataset, row)


def dataset_passages(dataset: str, path: StrPath, *, yield_errors: bool = False) -> Iterator[Passage | IngestError]:
    """The pooled context paragraphs of a dataset file, each once. PathQuestion has none."""
    if _dataset(dataset) == "pathquestion":
        return iter(())

    def passages() -> Iterator[Passage | IngestError]:
        seen: set[str] = set()
        for item in _per_row(path, _row_passages(dataset)):
            if isinstance(item, IngestError):
                yield item
                continue
            for p in item:
                if p.id not in seen:
                    seen.add(p.id)
                    yield p

    return checked(passages(), yield_errors)


# -- triples ---------------------------------------------------------------------------------


def _evidences(row: dict) -> list[Triple]:
    evidences = row.get("evidences", [])
    if not isinstance(evidences, list):
        raise ValueError("evidences must be a list of [subject, relation, object]")
    return [triple(e) for e in evidences]


# Question file stem -> its KB file, as in the PathQuestion readme.
_PQ_KB = {"PQ-2H": "2H-kb.txt", "PQ-3H": "3H-kb.txt", "PQL-2H": "PQL2-KB.txt", "PQL-3H": "PQL3-KB.txt",
          "PQL-3H_more": "PQL3-KB.txt"}


def _is_pathquestion_questions(path: StrPath) -> bool:
    """Question lines end with a `#`-separated path; KB lines never contain `#`."""
    for item in iter_lines(path):
        if not isinstance(item, IngestError):
            return "#" in item[1].split("\t")[-1]
    return False


def pathquestion_kb(path: StrPath) -> Path:
    """The KB file for a PathQuestion file: the file itself, or the KB next to a question file."""
    path = Path(path)
    if not _is_pathquestion_questions(path):
        return path
    kb = path.with_name(_PQ_KB.get(path.stem, "?"))
    if path.stem not in _PQ_KB or not kb.is_file():
        raise IngestError(f"a PathQuestion question file; its KB ({kb.name}) is not next to it, pass the KB "
                          "file (e.g. 2H-kb.txt) instead", str(path))
    return kb


def _pathquestion_triples(path: StrPath) -> Iterator[list[Triple] | IngestError]:
    for item in read_triples_file(pathquestion_kb(path), yield_errors=True):
        if isinstance(item, IngestError):
            yield item
        else:
            s, r, o = (pathquestion_name(x) for x in item)
            yield [(s, r, o)]


def dataset_triples(dataset: str, path: StrPath, *, yield_errors: bool = False) -> Iterator[Triple | IngestError]:
    """The knowledge-graph triples a dataset file offers, each once: 2Wiki `evidences` of every
    row, PathQuestion KB facts (readable names, see the module docstring). Others have none."""
    if _dataset(dataset) in ("hotpotqa", "musique"):
        return iter(())

    def triples() -> Iterator[Triple | IngestError]:
        seen: set[Triple] = set()
        source = _pathquestion_triples(path) if dataset == "pathquestion" else _per_row(path, _evidences)
        for item in source:
            if isinstance(item, IngestError):
                yield item
                continue
            for t in item:
                if t not in seen:
                    seen.add(t)
                    yield t

    return checked(triples(), yield_errors)


# -- questions -------------------------------------------------------------------------------


def _supporting_titles(facts: Any) -> tuple[str, ...]:
    if isinstance(facts, dict):  # HotpotQA HF layout: {title: [...], sent_id: [...]}
        return _unique(facts.get("title", []))
    return _unique(f[0] for f in facts or [])


def _hotpot_2wiki_item(dataset: str, row: dict) -> QAItem:
    titles = _supporting_titles(row.get("supporting_facts"))
    evidences = _evidences(row)
    passages = _context_passages(dataset, row) if "context" in row else []
    return QAItem(
        id=str(row.get("id", row.get("_id", ""))),
        question=_str(row["question"], "question"),
        answers=_unique([_str(row["answer"], "answer").strip()]),
        type=row.get("type"),
        level=row.get("level"),
        hops=2 if dataset == "hotpotqa" else len(evidences) or None,
        supporting_titles=titles,
        supporting_ids=_unique(p.id for p in passages if p.title in titles),
        topic_entities=_unique(s for s, _, _ in evidences),
    )


def _musique_item(row: dict) -> QAItem:
    aliases = row.get("answer_aliases") or []
    supporting = [p for p in row["paragraphs"] if p.get("is_supporting")]
    titles = _unique(p.get("title", "").strip() for p in supporting)
    rid = str(row["id"])
    return QAItem(
        id=rid,
        question=_str(row["question"], "question"),
        answers=_unique([_str(a, "answer").strip() for a in [row["answer"], *aliases]]),
        type=rid.split("__")[0] if "__" in rid else None,
        hops=len(row.get("question_decomposition") or []) or None,
        supporting_titles=titles,
        supporting_ids=_unique(make_passage(p.get("title", "").strip(), p["paragraph_text"].strip()).id
                               for p in supporting),
    )


_PQ_ANSWER = re.compile(r"(.*?)\((.*)\)")


def _pathquestion_questions(path: StrPath) -> Iterator[QAItem | IngestError]:
    stem = Path(path).stem
    for item in iter_lines(path):
        if isinstance(item, IngestError):
            yield item
            continue
        n, text = item
        fields = text.split("\t")
        if len(fields) != 3 or not all(f.strip() for f in fields) or "#" not in fields[2]:
            yield IngestError(f"expected 'question<TAB>answer(alt1/alt2)<TAB>path', got {text!r:.200}", str(path), n)
            continue
        question, answer, gold_path = (f.strip() for f in fields)
        m = _PQ_ANSWER.fullmatch(answer)
        answers = [m.group(1), *m.group(2).split("/")] if m else [answer]
        steps = gold_path.split("#")
        if "<end>" in steps:
            steps = steps[: steps.index("<end>")]
        yield QAItem(
            id=f"{stem}-{n}",
            question=pathquestion_name(question),
            answers=_unique(pathquestion_name(a.strip()) for a in answers),
            hops=len(steps) // 2 or None,
            topic_entities=(pathquestion_name(steps[0]),),
        )


def questions(dataset: str, path: StrPath, *, yield_errors: bool = False) -> Iterator[QAItem | IngestError]:
    """The questions of a dataset file with gold answers (all aliases) and evidence."""
    if _dataset(dataset) == "pathquestion":
        return checked(_pathquestion_questions(path), yield_errors)
    parse = _musique_item if dataset == "musique" else (lambda row: _hotpot_2wiki_item(dataset, row))
    source = (x if isinstance(x, IngestError) else x[0] for x in _per_row(path, lambda row: [parse(row)]))
    return checked(source, yield_errors)


def detect_dataset(path: StrPath) -> str | None:
    """Best guess of the dataset of a file from its first row, or None."""
    first = next((x for x in iter_lines(path) if not isinstance(x, IngestError)), None)
    if first is None:
        return None
    if first[1].lstrip()[0] not in "[{" and len(first[1].split("\t")) == 3:
        return "pathquestion"
    row = next((x[1] for x in read_rows(path, yield_errors=True) if not isinstance(x, IngestError)), None)
    if row is None:
        return None
    if "paragraphs" in row:
        return "musique"
    if "evidences" in row or "entity_ids" in row:
        return "2wiki"
    if "context" in row:
        return "hotpotqa"
    return None
