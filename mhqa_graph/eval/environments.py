"""The environment each benchmark file needs, built in the store from the file alone.

A passage dataset (HotpotQA, MuSiQue, 2Wiki with `context`) gives a corpus of its pooled
paragraphs; a KG dataset (2Wiki `evidences`, a PathQuestion KB) gives a graph; 2Wiki rows with
both give both. Corpus and graph share one name, by default `<dataset>-<file stem>`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import EntityNotFound, InvalidInput, StoreError
from ..ingest.datasets import benchmark, dataset_passages, dataset_triples
from ..ingest.runner import ingest_dataset
from ..store import open_store
from ..store.base import KnowledgeStore


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
    if corpus not in store.corpora():
        ingest(store, corpus=corpus, passages=read_plans_file(Path(data) / file))
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
    only when the store has a collection of that name). A collection that holds at least as many items but
    not the file's (a sample of its passages by id and title, of its triples by their facts) was built from
    another file: EnvironmentMismatch."""
    passages = [p for p in dataset_passages(dataset, path, yield_errors=True) if not isinstance(p, Exception)]
    triples = [t for t in dataset_triples(dataset, path, yield_errors=True) if not isinstance(t, Exception)]
    has = (passages and name in store.corpora()) or (triples and name in store.graphs())
    stats = store.stats() if has else None
    have_passages = stats.corpora.get(name, {}).get("passages", 0) if stats else 0
    have_triples = stats.graphs.get(name, {}).get("triples", 0) if stats else 0
    complete = have_passages >= len(passages) and have_triples >= len(triples)
    if has and complete:
        check_built_from(store, name, path, passages if have_passages else [], triples if have_triples else [])
    return Survey(corpus=name if passages else None, graph=name if triples else None,
                  items=len(passages) + len(triples), complete=complete)


def _sample(items: list) -> list:
    step = max(1, len(items) // SAMPLE)
    return items[::step][:SAMPLE] + items[-1:]


def check_built_from(store: KnowledgeStore, name: str, path: str | Path, passages: list, triples: list) -> None:
    """EnvironmentMismatch unless the store's corpus / graph `name` holds a sample of the file's passages and
    triples."""
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


@contextmanager
def open_environment(store_uri: str | None, dataset: str, path: str | Path,
                     announce: Callable[[str, int], Callable[[int], None] | None] | None = None
                     ) -> Iterator[tuple[KnowledgeStore, dict]]:
    """The store with the dataset file's environment, and `prepare`'s settings. A store that already
    holds the environment is opened read-only, so several evaluations can share it at once; otherwise
    it is opened for writing and the environment ingested (`announce` as in `prepare`)."""
    name = environment_name(dataset, path)
    try:
        store = open_store(store_uri, read_only=True)
    except StoreError:  # no store yet, or not readable without a writer's catch-up
        store = None
    if store is not None:
        found = survey(store, dataset, path, name)
        if found.complete:
            with store:
                yield store, found.settings(ingested=False)
            return
        store.close()
    with open_store(store_uri) as store:
        yield store, prepare(store, dataset, path, name, announce)
