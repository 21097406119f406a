"""The four benchmark datasets, each with one home: a `Benchmark` adapter that knows its questions
(with gold answers and gold chain), its environment (pooled passages, knowledge-graph triples) and
the name of that environment in a store. `benchmark(name)` returns the adapter.

- hotpotqa: JSON list or JSONL, Hugging Face layout (`context: {title: [...], sentences: [[...]]}`)
  or the original layout (`context: [[title, [sentence, ...]], ...]`). Passages only.
- 2wiki: 2WikiMultihopQA, original layout. Passages from `context` and triples from
  `evidences` of every row; a row without one of these fields offers nothing of that kind.
- musique: JSONL, `paragraphs: [{idx, title, paragraph_text, is_supporting}]`. Passages only.
- pathquestion: a KB file (`subject<TAB>relation<TAB>object`) or a question file
  (`question<TAB>answer(alt1/alt2)<TAB>path`), whose KB is found next to it. Triples only.

A question's gold chain (`QAItem.chain`) is one `Hop` per reasoning step, with the sub-question and
sub-answer where the data has them and the evidence (passage ids, triples) that step needs:
2Wiki `evidences` (+ `qa_pairs` in train files), MuSiQue `question_decomposition`, HotpotQA
`supporting_facts` (evidence only), PathQuestion gold paths. Diagnostics and training rewards read it.

Passages are deduplicated by `passage_id(title, text)`, so equal paragraphs of different rows
collapse and ingesting a file twice adds nothing. With `yield_errors=True` a malformed row is
yielded as an `IngestError` instead of being raised.

PathQuestion names (entities and relations) are underscored (`ludwig_ii_of_bavaria`,
`place_of_birth`; PathQuestion-Large's relations are Freebase paths, `__people__ethnicity__languages_spoken`).
They are stored in readable form, each run of underscores one space and none at either end (`ludwig ii of
bavaria`, `people ethnicity languages spoken`), so that they read naturally in prompts and match questions and
answers word by word. `pathquestion_name` is the one reader of a name: ingest, the built-from check of a store
(`eval.environments`) and the gold chains all go through it. For names without a run of underscores (the PQ files'
names) the mapping is a bijection: `pathquestion_original` gives back the name of the file. Questions and answers
are converted the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import IngestError, InvalidInput
from ..parsing import words
from ..types import Passage, Triple
from .files import StrPath, checked, iter_json, iter_lines, make_passage, read_triples_file, triple

T = TypeVar("T")


@dataclass(frozen=True)
class Hop:
    """One step of a question's gold chain: the sub-question and sub-answer where the data has them,
    and the evidence the step needs (passage ids as ingested, triples in their stored form)."""

    question: str | None = None
    answer: str | None = None
    passage_ids: tuple[str, ...] = ()
    triples: tuple[Triple, ...] = ()


@dataclass(frozen=True)
class QAItem:
    """One question with its gold answers and, where the dataset has them, gold evidence.

    `hops` is the number of gold steps: 2 for HotpotQA, the evidence triples for 2Wiki, the
    sub-questions for MuSiQue, the path's relations for PathQuestion. `supporting_ids` are the
    passage ids (as ingested) of the supporting paragraphs; `chain` the gold steps (see `Hop`).
    `topic_entities` are the entities the question names (KGQA practice: given to the agent).
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
    chain: tuple[Hop, ...] = ()


def pathquestion_name(original: str) -> str:
    """`ludwig_ii_of_bavaria` -> `ludwig ii of bavaria`, `__people__ethnicity__languages_spoken` -> `people ethnicity
    languages spoken` (the form stored in the graph): each run of underscores one space, none at either end."""
    return " ".join(original.replace("_", " ").split())


def pathquestion_original(readable: str) -> str:
    """`ludwig ii of bavaria` -> `ludwig_ii_of_bavaria` (the form of the PathQuestion files; a PathQuestion-Large
    Freebase relation is not given back: its leading and doubled underscores are not kept)."""
    return readable.replace(" ", "_")


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


def per_row(path: StrPath, parse: Callable[[dict], list[T]]) -> Iterator[list[T] | IngestError]:
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


def flat(items: Iterator[list[T] | IngestError]) -> Iterator[T | IngestError]:
    for item in items:
        if isinstance(item, IngestError):
            yield item
        else:
            yield from item


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


def _supporting_titles(facts: Any) -> tuple[str, ...]:
    if isinstance(facts, dict):  # HotpotQA HF layout: {title: [...], sent_id: [...]}
        return _unique(facts.get("title", []))
    return _unique(f[0] for f in facts or [])


def _evidences(row: dict) -> list[Triple]:
    evidences = row.get("evidences", [])
    if not isinstance(evidences, list):
        raise ValueError("evidences must be a list of [subject, relation, object]")
    return [triple(e) for e in evidences]


def _named_in(question: str, names: Iterable[str]) -> tuple[str, ...]:
    """The names that the question spells out (case-insensitive, as whole words)."""
    text = f" {words(question)} "
    return _unique(n for n in names if words(n) and f" {words(n)} " in text)


# -- the benchmarks ----------------------------------------------------------------------------


class Benchmark:
    """A benchmark dataset: its questions, the environment (passages, triples) its files give, and
    that environment's name in a store. Readers yield an `IngestError` for a malformed row."""

    name: str = ""

    def questions(self, path: StrPath) -> Iterator[QAItem | IngestError]:
        raise NotImplementedError

    def passages(self, path: StrPath) -> Iterator[Passage | IngestError]:
        return iter(())

    def triples(self, path: StrPath) -> Iterator[Triple | IngestError]:
        return iter(())

    def environment_name(self, path: StrPath) -> str:
        """`hotpotqa-dev_a`: the corpus and graph name of a file's environment."""
        return re.sub(r"[^\w.-]+", "_", f"{self.name}-{Path(path).stem}")

    def environment_file(self, path: StrPath) -> Path:
        """The file the environment of `path` is built from: `path` itself (a PathQuestion question file: its KB)."""
        return Path(path)


class _ContextBenchmark(Benchmark):
    """HotpotQA and 2Wiki: rows with a `context` of titled paragraphs."""

    joiner = ""  # HotpotQA sentences carry their leading spaces; 2Wiki sentences are joined with " "

    def row_passages(self, row: dict) -> list[Passage]:
        out = []
        for title, sents in _context(row["context"]):
            text = self.joiner.join(sents).strip()
            if text:
                out.append(make_passage(title, text))
        return out

    def passages(self, path: StrPath) -> Iterator[Passage | IngestError]:
        return flat(per_row(path, self.row_passages))

    def item(self, row: dict) -> QAItem:
        raise NotImplementedError

    def questions(self, path: StrPath) -> Iterator[QAItem | IngestError]:
        return flat(per_row(path, lambda row: [self.item(row)]))


class HotpotQA(_ContextBenchmark):
    """JSON list or JSONL, Hugging Face layout (`context: {title: [...], sentences: [[...]]}`) or the
    original layout (`context: [[title, [sentence, ...]], ...]`). Passages only; the gold chain is
    one hop per supporting paragraph, without sub-answers."""

    name = "hotpotqa"

    def item(self, row: dict) -> QAItem:
        titles = _supporting_titles(row.get("supporting_facts"))
        by_title = {p.title: p.id for p in self.row_passages(row)}
        return QAItem(
            id=str(row.get("id", row.get("_id", ""))),
            question=_str(row["question"], "question"),
            answers=_unique([_str(row["answer"], "answer").strip()]),
            type=row.get("type"),
            level=row.get("level"),
            hops=2,
            supporting_titles=titles,
            supporting_ids=_unique(by_title.get(t, "") for t in titles),
            chain=tuple(Hop(passage_ids=(by_title[t],)) for t in titles if t in by_title),
        )


class TwoWiki(_ContextBenchmark):
    """2WikiMultihopQA, original layout. Passages from `context` and triples from `evidences` of every
    row; a row without one of these fields offers nothing of that kind. One hop per evidence triple,
    its object the sub-answer, its passage the supporting paragraph about its subject; train files'
    `qa_pairs` give the sub-questions. Topic entities: evidence subjects the question names."""

    name = "2wiki"
    joiner = " "

    def row_passages(self, row: dict) -> list[Passage]:
        return super().row_passages(row) if "context" in row else []

    def triples(self, path: StrPath) -> Iterator[Triple | IngestError]:
        return flat(per_row(path, _evidences))

    def item(self, row: dict) -> QAItem:
        question = _str(row["question"], "question")
        evidences = _evidences(row)
        titles = _supporting_titles(row.get("supporting_facts"))
        by_title = {p.title: p.id for p in self.row_passages(row) if p.title in titles}
        pairs = row.get("qa_pairs") if isinstance(row.get("qa_pairs"), list) else []
        pairs = pairs if len(pairs) == len(evidences) else []

        def passages_about(subject: str) -> tuple[str, ...]:
            key = subject.lower()
            return tuple(pid for title, pid in by_title.items()
                         if title.lower() == key or title.lower().startswith(key + " ("))

        chain = tuple(Hop(question=pairs[i].get("question") if pairs and isinstance(pairs[i], dict) else None,
                          answer=o, passage_ids=passages_about(s), triples=((s, r, o),))
                      for i, (s, r, o) in enumerate(evidences))
        return QAItem(
            id=str(row.get("_id", row.get("id", ""))),
            question=question,
            answers=_unique([_str(row["answer"], "answer").strip()]),
            type=row.get("type"),
            hops=len(evidences) or None,
            supporting_titles=titles,
            supporting_ids=tuple(by_title.values()),
            topic_entities=_named_in(question, (s for s, _, _ in evidences)),
            chain=chain,
        )


class MuSiQue(Benchmark):
    """JSONL, `paragraphs: [{idx, title, paragraph_text, is_supporting}]`. Passages only; one hop per
    `question_decomposition` step, with its sub-question, sub-answer and supporting paragraph."""

    name = "musique"

    @staticmethod
    def row_passages(row: dict) -> list[Passage]:
        paragraphs = row["paragraphs"]
        if not isinstance(paragraphs, list) or not all(isinstance(p, dict) for p in paragraphs):
            raise ValueError("paragraphs must be a list of objects")
        out = []
        for p in paragraphs:
            text = _str(p["paragraph_text"], "paragraph_text").strip()
            if text:
                out.append(make_passage(_str(p.get("title", ""), "title").strip(), text))
        return out

    def passages(self, path: StrPath) -> Iterator[Passage | IngestError]:
        return flat(per_row(path, self.row_passages))

    def item(self, row: dict) -> QAItem:
        aliases = row.get("answer_aliases") or []
        supporting = [p for p in row["paragraphs"] if p.get("is_supporting")]
        titles = _unique(p.get("title", "").strip() for p in supporting)
        ids = {p.get("idx", i): make_passage(p.get("title", "").strip(), p["paragraph_text"].strip()).id
               for i, p in enumerate(row["paragraphs"]) if p["paragraph_text"].strip()}
        steps = row.get("question_decomposition") or []
        chain = tuple(Hop(question=step.get("question"), answer=step.get("answer"),
                          passage_ids=(ids[step["paragraph_support_idx"]],)
                          if step.get("paragraph_support_idx") in ids else ())
                      for step in steps if isinstance(step, dict))
        rid = str(row["id"])
        return QAItem(
            id=rid,
            question=_str(row["question"], "question"),
            answers=_unique([_str(a, "answer").strip() for a in [row["answer"], *aliases]]),
            type=rid.split("__")[0] if "__" in rid else None,
            hops=len(steps) or None,
            supporting_titles=titles,
            supporting_ids=_unique(make_passage(p.get("title", "").strip(), p["paragraph_text"].strip()).id
                                   for p in supporting),
            chain=chain,
        )

    def questions(self, path: StrPath) -> Iterator[QAItem | IngestError]:
        return flat(per_row(path, lambda row: [self.item(row)]))


# Question file stem -> its KB file, as in the PathQuestion readme.
_PQ_KB = {"PQ-2H": "2H-kb.txt", "PQ-3H": "3H-kb.txt", "PQL-2H": "PQL2-KB.txt", "PQL-3H": "PQL3-KB.txt",
          "PQL-3H_more": "PQL3-KB.txt"}
_PQ_ANSWER = re.compile(r"(.*?)\((.*)\)")


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


class PathQuestion(Benchmark):
    """A KB file (`subject<TAB>relation<TAB>object`) or a question file
    (`question<TAB>answer(alt1/alt2)<TAB>path`), whose KB is found next to it. Triples only, in
    readable names (see the module docstring); the environment is named after the KB, so the question
    files of one KB share one graph. One hop per relation of the gold path; the topic entity is the
    path's start."""

    name = "pathquestion"

    def triples(self, path: StrPath) -> Iterator[Triple | IngestError]:
        for item in read_triples_file(pathquestion_kb(path), yield_errors=True):
            yield item if isinstance(item, IngestError) else tuple(pathquestion_name(x) for x in item)

    def environment_name(self, path: StrPath) -> str:
        return super().environment_name(pathquestion_kb(path))

    def environment_file(self, path: StrPath) -> Path:
        return pathquestion_kb(path)

    def questions(self, path: StrPath) -> Iterator[QAItem | IngestError]:
        stem = Path(path).stem
        for item in iter_lines(path):
            if isinstance(item, IngestError):
                yield item
                continue
            n, text = item
            fields = text.split("\t")
            if len(fields) != 3 or not all(f.strip() for f in fields) or "#" not in fields[2]:
                yield IngestError(f"expected 'question<TAB>answer(alt1/alt2)<TAB>path', got {text!r:.200}",
                                  str(path), n)
                continue
            question, answer, gold_path = (f.strip() for f in fields)
            m = _PQ_ANSWER.fullmatch(answer)
            answers = [m.group(1), *m.group(2).split("/")] if m else [answer]
            steps = gold_path.split("#")
            if "<end>" in steps:
                steps = steps[: steps.index("<end>")]
            names = [pathquestion_name(x) for x in steps]
            chain = tuple(Hop(answer=names[i + 2], triples=((names[i], names[i + 1], names[i + 2]),))
                          for i in range(0, len(names) - 2, 2))
            yield QAItem(
                id=f"{stem}-{n}",
                question=pathquestion_name(question),
                answers=_unique(pathquestion_name(a.strip()) for a in answers),
                hops=len(steps) // 2 or None,
                topic_entities=(names[0],),
                chain=chain,
            )


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (HotpotQA(), TwoWiki(), MuSiQue(), PathQuestion())}
DATASETS = tuple(BENCHMARKS)


def benchmark(name: str) -> Benchmark:
    """The adapter of a dataset name; InvalidInput for an unknown one."""
    if name not in BENCHMARKS:
        raise InvalidInput(f"dataset must be one of {DATASETS}, got {name!r}")
    return BENCHMARKS[name]


def _deduplicated(items: Iterator[T | IngestError], key: Callable[[T], Any]) -> Iterator[T | IngestError]:
    seen: set = set()
    for item in items:
        if not isinstance(item, IngestError):
            if key(item) in seen:
                continue
            seen.add(key(item))
        yield item


def dataset_passages(dataset: str, path: StrPath, *, yield_errors: bool = False) -> Iterator[Passage | IngestError]:
    """The pooled context paragraphs of a dataset file, each once. PathQuestion has none."""
    return checked(_deduplicated(benchmark(dataset).passages(path), lambda p: p.id), yield_errors)


def dataset_triples(dataset: str, path: StrPath, *, yield_errors: bool = False) -> Iterator[Triple | IngestError]:
    """The knowledge-graph triples a dataset file offers, each once: 2Wiki `evidences` of every
    row, PathQuestion KB facts (readable names, see the module docstring). Others have none."""
    return checked(_deduplicated(benchmark(dataset).triples(path), lambda t: t), yield_errors)


def questions(dataset: str, path: StrPath, *, yield_errors: bool = False) -> Iterator[QAItem | IngestError]:
    """The questions of a dataset file with gold answers (all aliases), evidence and gold chain."""
    return checked(benchmark(dataset).questions(path), yield_errors)


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


def check_dataset_file(dataset: str, path: StrPath) -> None:
    """InvalidInput when the file is plainly of another dataset than `dataset` (e.g. `2wiki` on a HotpotQA
    file, whose paragraphs would be joined the wrong way and its questions read without their evidence).
    Only clear signs count: MuSiQue `paragraphs`, 2Wiki `evidences`/`entity_ids`, HotpotQA `level`,
    PathQuestion tab-separated lines; a file with none of them passes."""
    benchmark(dataset)
    try:
        found = detect_dataset(path)
    except (IngestError, IndexError):
        return  # unreadable or empty: the readers say so
    if found is None or found == dataset:
        return
    if found == "hotpotqa":  # `context` alone: 2Wiki rows have it too; HotpotQA's own mark is `level`
        row = next((x[1] for x in read_rows(path, yield_errors=True) if not isinstance(x, IngestError)), {})
        if "level" not in row:
            return
    raise InvalidInput(f"{path} looks like a {found} file, not {dataset}; pass --dataset {found}")
