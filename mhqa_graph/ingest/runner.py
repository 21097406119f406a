"""Write triples and passages into a store in batches, counting what was new and what was bad."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from ..errors import IngestError, InvalidInput
from ..store.base import KnowledgeStore
from ..types import Passage, Triple
from .datasets import check_dataset_file, dataset_passages, dataset_triples
from .files import StrPath

MAX_ERRORS = 20  # error messages kept in a report
T = TypeVar("T")
Progress = Callable[[int], None]


@dataclass
class IngestReport:
    """What an ingest read (`seen`, after the readers' deduplication) and wrote (`added`: new to the store)."""

    triples_seen: int = 0
    triples_added: int = 0
    passages_seen: int = 0
    passages_added: int = 0
    skipped_bad: int = 0
    errors: list[str] = field(default_factory=list)  # the first MAX_ERRORS messages of skipped rows


class _Run:
    """Shared state of one ingest: the report, rows done, bad rows already counted."""

    def __init__(self, batch_size: int, skip_bad: bool, progress: Progress | None) -> None:
        self.report = IngestReport()
        self.batch_size, self.skip_bad, self.progress = batch_size, skip_bad, progress
        self.done = 0
        self.bad: set[object] = set()

    def skip(self, err: IngestError) -> None:
        # The passage and the triple reader may both meet the same bad row: count it once.
        key = (err.path, err.line) if err.line else str(err)
        if key not in self.bad:
            self.bad.add(key)
            self.report.skipped_bad += 1
            if len(self.report.errors) < MAX_ERRORS:
                self.report.errors.append(str(err))

    def load(self, items: Iterable[T | IngestError], write: Callable[[list[T]], int]) -> tuple[int, int]:
        """Write `items` in batches; returns (seen, added). On a bad row that is not skipped,
        everything read before it is written, then the error is raised."""
        batch: list[T] = []
        seen = added = 0

        def flush() -> None:
            nonlocal added
            if batch:
                added += write(batch)
                batch.clear()
            if self.progress:
                self.progress(self.done)

        try:
            for item in items:
                self.done += 1
                if isinstance(item, IngestError):
                    if not self.skip_bad:
                        raise item
                    self.skip(item)
                    continue
                batch.append(item)
                seen += 1
                if len(batch) >= self.batch_size:
                    flush()
        except IngestError:
            flush()
            raise
        flush()
        return seen, added


def ingest(
    store: KnowledgeStore,
    *,
    graph: str | None = None,
    corpus: str | None = None,
    triples: Iterable[Triple | IngestError] | None = None,
    passages: Iterable[Passage | IngestError] | None = None,
    batch_size: int = 1000,
    skip_bad: bool = False,
    progress: Progress | None = None,
) -> IngestReport:
    """Add `passages` to `corpus` and `triples` to `graph`, `batch_size` at a time.

    Each batch is committed by the store, so a failure keeps everything before it. A bad row
    (an `IngestError`, yielded or raised by a reader) stops the ingest with that error, after
    writing the rows before it; with `skip_bad` a yielded one is counted and skipped instead
    (readers yield them when called with `yield_errors=True`). `progress(n)` is called after
    each batch with the number of rows read so far.
    """
    if triples is not None and not graph:
        raise InvalidInput("triples need a graph name")
    if passages is not None and not corpus:
        raise InvalidInput("passages need a corpus name")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
    run = _Run(batch_size, skip_bad, progress)
    report = run.report
    if passages is not None and corpus:
        report.passages_seen, report.passages_added = run.load(passages, partial(store.add_passages, corpus))
    if triples is not None and graph:
        report.triples_seen, report.triples_added = run.load(triples, partial(store.add_triples, graph))
    return report


def environment_sha256(dataset: str, path: StrPath) -> str:
    """The sha256 of what a dataset file gives its environment, as read: its passages (id, title, text) and triples,
    in file order, bad rows left out (a PathQuestion question file gives its KB's triples). A store records it with
    each collection, so `mhqa eval` tells an edited file from the one a collection was built from, while a file
    written again with the same items (line endings, key order, a trailing newline) is the same."""
    digest = hashlib.sha256()
    for passage in dataset_passages(dataset, path, yield_errors=True):
        if not isinstance(passage, Exception):
            digest.update(json.dumps(["p", passage.id, passage.title, passage.text]).encode() + b"\n")
    for fact in dataset_triples(dataset, path, yield_errors=True):
        if not isinstance(fact, Exception):
            digest.update(json.dumps(["t", *fact]).encode() + b"\n")
    return digest.hexdigest()


def ingest_dataset(
    store: KnowledgeStore,
    dataset: str,
    path: StrPath,
    name: str,
    *,
    batch_size: int = 1000,
    skip_bad: bool = False,
    progress: Progress | None = None,
) -> IngestReport:
    """Ingest what a dataset file offers: its pooled paragraphs into corpus `name` and its
    triples into graph `name` (see `datasets`). A corpus or graph is only created if the file
    has rows for it. InvalidInput if the file is plainly of another dataset (`check_dataset_file`) or
    offers no passage or triple at all (an empty file, or every row bad and skipped). Once the file is in,
    each collection records the digest of its items (`environment_sha256`, `set_file_sha256`), by which `mhqa eval`
    tells the file from an edited one."""
    check_dataset_file(dataset, path)
    digest = environment_sha256(dataset, path)
    report = ingest(
        store,
        graph=name,
        corpus=name,
        triples=dataset_triples(dataset, path, yield_errors=True),
        passages=dataset_passages(dataset, path, yield_errors=True),
        batch_size=batch_size,
        skip_bad=skip_bad,
        progress=progress,
    )
    if report.passages_seen + report.triples_seen == 0:
        skipped = f" ({report.skipped_bad} bad rows skipped)" if report.skipped_bad else ""
        raise InvalidInput(f"{path} holds no {dataset} passages or triples{skipped}; nothing was ingested")
    for kind, seen in (("corpus", report.passages_seen), ("graph", report.triples_seen)):
        if seen:
            store.set_file_sha256(kind, name, digest)
    return report
