"""The environment each benchmark file needs, built in the store from the file alone.

A passage dataset (HotpotQA, MuSiQue, 2Wiki with `context`) gives a corpus of its pooled
paragraphs; a KG dataset (2Wiki `evidences`, a PathQuestion KB) gives a graph; 2Wiki rows with
both give both. Corpus and graph share one name, by default `<dataset>-<file stem>`, and keep the
digest of the items they were built from, so an edited file is told from the one built.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import EntityNotFound, InvalidInput, StoreError, StoreLocked
from ..ingest.datasets import benchmark, dataset_passages, dataset_triples
from ..ingest.runner import environment_sha256, ingest_dataset
from ..store import open_store
from ..store.base import KnowledgeStore

# How long an eval that must build its environment waits while another process holds the embedded store's writer
# lock (most often another eval building the same environment), surveying the store again now and then, before
# StoreLocked. `mhqa ingest` does not wait: it says StoreLocked at once, and its user retries.
BUILD_WAIT_S = 300.0
SURVEY_EVERY_S = 2.0  # the longest pause between two surveys while waiting


class EnvironmentMismatch(InvalidInput):
    """The store holds a corpus or graph of the name a dataset file's environment takes, built from another
    file (or from this one before it was edited)."""

    def __init__(self, name: str, uri: str, path: str | Path, why: str) -> None:
        super().__init__(f"{uri} holds {name!r}, but not built from {Path(path).name} ({why}); give another "
                         "--store, or ingest this file under another name and pass it with --corpus/--graph")


@dataclass(frozen=True)
class DevEnvironment:
    """A dev environment of the benchmark data folder (`../shared/data`): a dataset file and its kind."""

    dataset: str
    file: str  # relative to the data folder
    kind: str  # "kg" or "text"


# the environments the agent benchmark and the recorded transcripts use
DEV_ENVIRONMENTS = {
    "pq2h": DevEnvironment("pathquestion", "pathquestion/PQ-2H.txt", "kg"),
    "pq3h": DevEnvironment("pathquestion", "pathquestion/PQ-3H.txt", "kg"),
    "2wiki-kg": DevEnvironment("2wiki", "2wikimultihopqa/dev_evidences.json", "kg"),
    "hotpot": DevEnvironment("hotpotqa", "hotpotqa/dev_b.jsonl", "text"),
    "2wiki-text": DevEnvironment("2wiki", "2wikimultihopqa/dev_context.jsonl", "text"),
}


# the worked plans the dev environments' planners may be shown (`plan_examples`): 2Wiki's training split
WORKED_PLANS = ("plans", "2wikimultihopqa/train_context.json")  # (corpus, file in the data folder)


def ensure_worked_plans(store: KnowledgeStore, data: Path) -> str:
    """The corpus of worked plans (WORKED_PLANS), ingested into `store` from `data` unless it is there; its name."""
    from ..ingest.plans import read_plans_file
    from ..ingest.runner import ingest

    corpus, file = WORKED_PLANS
    if corpus in store.corpora():
        return corpus
    if not getattr(store, "read_only", False):
        ingest(store, corpus=corpus, passages=read_plans_file(Path(data) / file))
        return corpus
    with open_store(store.uri) as writer:  # `open_environment` gives a read-only store
        if corpus not in writer.corpora():
            ingest(writer, corpus=corpus, passages=read_plans_file(Path(data) / file))
    return corpus


def environment_name(dataset: str, path: str | Path) -> str:
    """`hotpotqa-dev_a`; a PathQuestion question file is named after its KB (`pathquestion-2H-kb`),
    so the question files of one KB share one graph."""
    return benchmark(dataset).environment_name(path)


def _count(items) -> int:
    return sum(1 for x in items if not isinstance(x, Exception))


@dataclass(frozen=True)
class Survey:
    """What a dataset file offers against what the store holds under `name`."""

    corpus: str | None  # name, when the file has passages
    graph: str | None  # name, when the file has triples
    items: int  # passages and triples of the file
    complete: bool  # the store holds at least as many of each

    def settings(self, ingested: bool) -> dict:
        return {"corpus": self.corpus, "graph": self.graph, "ingested": ingested}


SAMPLE = 16  # items of a file looked up in the store's collection of its name


def survey(store: KnowledgeStore, dataset: str, path: str | Path, name: str) -> Survey:
    """Count the file's passages and triples and compare them with the store's (one stats() call,
    only when the store has a collection of that name). A collection that records the digest of other items than
    this file's (`environment_sha256`, `set_file_sha256`) was built from another file or an edited one:
    EnvironmentMismatch, however many items it holds. One that records none (a store built before stores kept it)
    and holds at least as many items is checked by a sample of the file's passages (by id and title) and triples
    (by their facts), which an edit elsewhere in the file escapes."""
    passages = [p for p in dataset_passages(dataset, path, yield_errors=True) if not isinstance(p, Exception)]
    triples = [t for t in dataset_triples(dataset, path, yield_errors=True) if not isinstance(t, Exception)]
    kinds = [k for k, items, names in (("corpus", passages, store.corpora), ("graph", triples, store.graphs))
             if items and name in names()]
    stats = store.stats() if kinds else None
    have_passages = stats.corpora.get(name, {}).get("passages", 0) if stats else 0
    have_triples = stats.graphs.get(name, {}).get("triples", 0) if stats else 0
    complete = have_passages >= len(passages) and have_triples >= len(triples)
    recorded = {kind: store.file_sha256(kind, name) for kind in kinds}
    if any(recorded.values()):
        source = benchmark(dataset).environment_file(path)
        digest = environment_sha256(dataset, path)
        for kind, sha256 in recorded.items():
            if sha256 and sha256 != digest:
                raise EnvironmentMismatch(name, store.uri, source, f"its {kind} was built from items of sha256 "
                                          f"{sha256[:16]}..., this file's are {digest[:16]}...")
    if kinds and complete and not all(recorded.values()):
        check_built_from(store, name, path, passages if have_passages else [], triples if have_triples else [])
    return Survey(corpus=name if passages else None, graph=name if triples else None,
                  items=len(passages) + len(triples), complete=complete)


def _sample(items: list) -> list:
    step = max(1, len(items) // SAMPLE)
    return items[::step][:SAMPLE] + items[-1:]


def check_built_from(store: KnowledgeStore, name: str, path: str | Path, passages: list, triples: list) -> None:
    """EnvironmentMismatch unless the store's corpus / graph `name` holds a sample of the file's passages and
    triples: the check of a collection that records no file sha256 (one built before stores kept it)."""
    if passages:
        stored = {(p.id, p.title) for p in store.passages(name)}
        missing = next((p for p in _sample(passages) if (p.id, p.title) not in stored), None)
        if missing is not None:
            raise EnvironmentMismatch(name, store.uri, path, f"its passage {missing.id!r} is not in the corpus")
    for subject, relation, obj in _sample(triples):
        try:
            facts = store.node_info(name, subject).facts
        except EntityNotFound:
            facts = []
        if not any(f.relation == relation and f.other == obj and f.direction == "out" for f in facts):
            raise EnvironmentMismatch(name, store.uri, path, f"its fact ({subject}, {relation}, {obj}) is not in "
                                      "the graph")


def prepare(store: KnowledgeStore, dataset: str, path: str | Path, name: str,
            announce: Callable[[str, int], Callable[[int], None] | None] | None = None) -> dict:
    """Make sure corpus/graph `name` hold what the dataset file offers, ingesting it only when the
    store has fewer passages or triples than the file (a complete earlier build is not redone; an
    interrupted one is completed, since ingestion is idempotent). Before ingesting, `announce(what,
    items)` is called and may return a progress callback (items done so far).

    Returns {"corpus": name or None, "graph": name or None, "ingested": bool}: the settings the
    agent needs, and whether anything had to be ingested this time.
    """
    found = survey(store, dataset, path, name)
    if not found.complete:
        what = f"ingest {Path(path).name} into {name!r} in {store.uri}"
        progress = announce(what, found.items) if announce else None
        ingest_dataset(store, dataset, path, name, skip_bad=True, progress=progress)
    return found.settings(ingested=not found.complete)


def _built(store_uri: str | None, dataset: str, path: str | Path, name: str) -> tuple[KnowledgeStore, dict] | None:
    """The store opened read-only and its settings if it holds the file's whole environment, else None."""
    try:
        store = open_store(store_uri, read_only=True)
    except StoreError:  # no store yet, or not readable without a writer's catch-up
        return None
    try:
        found = survey(store, dataset, path, name)
    except BaseException:
        store.close()
        raise
    if found.complete:
        return store, found.settings(ingested=False)
    store.close()
    return None


@contextmanager
def open_environment(store_uri: str | None, dataset: str, path: str | Path,
                     announce: Callable[[str, int], Callable[[int], None] | None] | None = None
                     ) -> Iterator[tuple[KnowledgeStore, dict]]:
    """The store with the dataset file's environment, and `prepare`'s settings. The store is opened read-only, so
    several evaluations can share it at once; one that lacks the environment is first opened for writing, the
    environment ingested (`announce` as in `prepare`) and the writer closed. While another process holds the writer
    lock (StoreLocked), such as another eval building the same environment, this one waits up to BUILD_WAIT_S,
    surveying again every few seconds: what that process built is used, not ingested again."""
    name = environment_name(dataset, path)
    deadline, pause = time.monotonic() + BUILD_WAIT_S, 0.1
    while True:
        built = _built(store_uri, dataset, path, name)
        if built is not None:
            with built[0]:
                yield built
            return
        try:
            writer = open_store(store_uri)
        except StoreLocked as exc:
            if time.monotonic() >= deadline:
                raise StoreLocked(f"{exc}; waited {BUILD_WAIT_S:.0f} s for it to build or give back the store, "
                                  f"which still lacks {name!r}: retry once that process is done") from None
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(2 * pause, SURVEY_EVERY_S)
            continue
        with writer:
            settings = prepare(writer, dataset, path, name, announce)
        break
    with open_store(store_uri, read_only=True) as store:
        yield store, settings
