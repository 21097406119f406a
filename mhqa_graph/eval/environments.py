"""The environment each benchmark file needs, built in the store from the file alone.

A passage dataset (HotpotQA, MuSiQue, 2Wiki with `context`) gives a corpus of its pooled
paragraphs; a KG dataset (2Wiki `evidences`, a PathQuestion KB) gives a graph; 2Wiki rows with
both give both. Corpus and graph share one name, by default `<dataset>-<file stem>`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..ingest.datasets import benchmark, dataset_passages, dataset_triples
from ..ingest.runner import ingest_dataset
from ..store.base import KnowledgeStore


def environment_name(dataset: str, path: str | Path) -> str:
    """`hotpotqa-dev_a`; a PathQuestion question file is named after its KB (`pathquestion-2H-kb`),
    so the question files of one KB share one graph."""
    return benchmark(dataset).environment_name(path)


def _count(items) -> int:
    return sum(1 for x in items if not isinstance(x, Exception))


def prepare(store: KnowledgeStore, dataset: str, path: str | Path, name: str,
            announce: Callable[[str, int], Callable[[int], None] | None] | None = None) -> dict:
    """Make sure corpus/graph `name` hold what the dataset file offers, ingesting it only when the
    store has fewer passages or triples than the file (a complete earlier build is not redone; an
    interrupted one is completed, since ingestion is idempotent). Before ingesting, `announce(what,
    items)` is called and may return a progress callback (items done so far).

    Returns {"corpus": name or None, "graph": name or None, "ingested": bool}: the settings the
    agent needs, and whether anything had to be ingested this time.
    """
    n_passages = _count(dataset_passages(dataset, path, yield_errors=True))
    n_triples = _count(dataset_triples(dataset, path, yield_errors=True))
    stats = store.stats()
    have_passages = stats.corpora.get(name, {}).get("passages", 0)
    have_triples = stats.graphs.get(name, {}).get("triples", 0)
    ingested = have_passages < n_passages or have_triples < n_triples
    if ingested:
        what = f"ingest {Path(path).name} into {name!r} in {store.uri}"
        progress = announce(what, n_passages + n_triples) if announce else None
        ingest_dataset(store, dataset, path, name, skip_bad=True, progress=progress)
    return {"corpus": name if n_passages else None, "graph": name if n_triples else None, "ingested": ingested}
