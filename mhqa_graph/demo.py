"""`mhqa demo`: real benchmark data into the embedded store, real queries, the six agents with an offline model.

Without `--data` it runs on the sample the package bundles (`mhqa_graph/demo_data/`, its README has the sources and
licences): 30 HotpotQA dev rows and the evidence graph of 40 2WikiMultihopQA dev questions. With `--data` (the
benchmark data folder, `../shared/data` in this project) it runs on the full HotpotQA `dev_a.jsonl` and the
PathQuestion 2-hop KB. The questions follow a fixed rule, never picked by hand: the first `n` questions (default 1)
of the HotpotQA file for `direct`, `rag`, `opera` and `mujica` over its pooled paragraphs, and of the KG file for
`omne` and `auto` over its graph. The bundled 2Wiki rows are compositional questions whose evidence chain starts
from entities the question names (2Wiki's evidence graph names one entity differently from row to row, so a walk
often cannot reach other rows' answers); PathQuestion's questions are paths of its own KB. The corpus and graph
carry the names `mhqa eval` gives these files (`hotpotqa-demo` and `2wiki-demo_evidences`; `hotpotqa-dev_a` and
`pathquestion-2H-kb`), so an eval on the demo store reuses them. An agent counts as correct when every answer it
gave scores F1 >= 0.5 against a gold alias (EM and F1 are shown beside each answer).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from .designs import spec_of
from .errors import InvalidInput
from .eval.environments import environment_name
from .eval.runner import graph_inputs
from .eval.scoring import score
from .ingest.datasets import QAItem, questions
from .ingest.runner import ingest_dataset
from .store import KnowledgeStore, open_store

DEMO_DATA = Path(__file__).resolve().parent / "demo_data"  # the bundled sample (package data)
BUNDLED = (("hotpotqa", DEMO_DATA / "hotpotqa" / "demo.jsonl"),
           ("2wiki", DEMO_DATA / "2wikimultihopqa" / "demo_evidences.json"))
HOTPOT = ("hotpotqa", "hotpotqa/dev_a.jsonl")  # the full sets, in the --data folder
KG = ("pathquestion", "pathquestion/PQ-2H.txt")
# each file of the full sets -> what to download into its place
DOWNLOADS = {HOTPOT[1]: "HotpotQA's distractor dev rows, Hugging Face layout, one JSON object a line "
                        "(https://hotpotqa.github.io/)",
             KG[1]: "PathQuestion's PQ-2H.txt (https://github.com/zmtkeke/IRN)",
             "pathquestion/2H-kb.txt": "PathQuestion's 2H-kb.txt, the KB of PQ-2H.txt (https://github.com/zmtkeke/IRN)"}
DEFAULT_STORE = "embedded://.mhqa-demo"
DEFAULT_LLM = "llamacpp:qwen2.5-coder-1.5b"
TEXT_AGENTS = ("direct", "rag", "opera", "mujica")
KG_AGENTS = ("omne", "auto")
CORRECT_F1 = 0.5
# Small settings keep a CPU run to minutes: short prompts, short replies, one rewrite.
SETTINGS = {"top_k": 3, "max_new_tokens": 192, "max_rewrites": 1}


@contextmanager
def _bar(console: Console, label: str, total: int | None, download: bool = False) -> Iterator[Callable[..., None]]:
    count = DownloadColumn() if download else MofNCompleteColumn()
    with Progress(TextColumn(f"  [bold]{escape(label)}"), BarColumn(), count, TimeElapsedColumn(), console=console,
                  disable=not console.is_terminal) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done, total=None: bar.update(task, completed=done, **({"total": total} if total else {}))


def _ingest(store: KnowledgeStore, dataset: str, path: Path, console: Console) -> str:
    """Ingest a file once into the environment `mhqa eval` would build; the corpus/graph name."""
    name = environment_name(dataset, path)
    stats = store.stats()
    if name in stats.corpora or name in stats.graphs:
        # ingestion is idempotent; a rerun would only re-read
        console.print(f"  {name}: in the store already", markup=False, highlight=False)
        return name
    started = time.perf_counter()
    with _bar(console, f"ingest + embed {path.name}", None) as tick:
        report = ingest_dataset(store, dataset, path, name, progress=tick)
    console.print(f"  {name}: {report.passages_added} passages, {report.triples_added} triples "
                  f"({time.perf_counter() - started:.1f} s)", markup=False, highlight=False)
    return name


def demo_files(data: Path | None) -> tuple[tuple[str, Path], tuple[str, Path]]:
    """(dataset, file) of the text questions and of the KG questions: the bundled sample without `data`, else the
    full sets in the `data` folder (InvalidInput naming what to download, and where to put it, for a missing file)."""
    if data is None:
        return BUNDLED
    for rel, what in DOWNLOADS.items():
        if not (data / rel).is_file():
            raise InvalidInput(f"{data / rel} not found: put {what} there, or leave out --data to run on the bundled "
                               "sample")
    return (HOTPOT[0], data / HOTPOT[1]), (KG[0], data / KG[1])


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{seconds:.1f} s"


class StepTimer:
    """Numbered demo steps: a rule before each, its time after it, and all of them in one line at the end."""

    def __init__(self, console: Console) -> None:
        self.console, self.times = console, []  # (step number, seconds)

    @contextmanager
    def __call__(self, title: str) -> Iterator[None]:
        self.console.rule(Text(title))
        started = time.perf_counter()
        yield
        self.times.append((title.split(".")[0], time.perf_counter() - started))
        self.console.print(f"  step {self.times[-1][0]}: {_clock(self.times[-1][1])}", markup=False, highlight=False)

    def summary(self) -> str:
        return ", ".join(f"step {number} {_clock(seconds)}" for number, seconds in self.times)


def run_demo(store_uri: str | None, data: Path | None, llm: str | None, n_questions: int, console: Console) -> int:
    """Run the demo on the bundled sample (`data` None) or the full sets in `data`; returns how many of the six
    agents answered correctly."""
    from .models.factory import check_chat_spec

    started = time.perf_counter()
    spec = llm or DEFAULT_LLM
    check_chat_spec(spec)  # a bad --llm fails before any work
    if n_questions < 1:
        raise InvalidInput(f"--questions must be >= 1, got {n_questions}")
    text_file, kg_file = demo_files(data)
    hotpot: list[QAItem] = list(itertools.islice(questions(*text_file), n_questions))
    paths: list[QAItem] = list(itertools.islice(questions(*kg_file), n_questions))
    timer = StepTimer(console)
    with open_store(store_uri or DEFAULT_STORE) as store:
        with timer(f"1. Ingest real benchmark data into {store.uri}"):
            corpus = _ingest(store, *text_file, console)
            kg = _ingest(store, *kg_file, console)

        with timer(f"2. Passage search on {corpus} (supporting titles marked *)"):
            for item in hotpot:
                console.print(Text.assemble(("Q:", "bold"), " ", item.question), highlight=False)
                for mode in ("bm25", "dense", "hybrid"):
                    hits = store.search(corpus, item.question, k=3, mode=mode)
                    titles = ", ".join(("*" if h.title in item.supporting_titles else "") + h.title for h in hits)
                    console.print(f"  {mode:>6}: {titles}", markup=False, highlight=False)

        with timer(f"3. Entity matching and node facts on the KG {kg}"):
            for item in paths:
                console.print(Text.assemble(("Q:", "bold"), " ", item.question), highlight=False)
                hits = store.match_entities(kg, item.question, k=3)
                console.print("  match_entities: " + ", ".join(f"{h.name} ({h.score:.3f})" for h in hits),
                              markup=False, highlight=False)
                for hit in hits[:1]:
                    console.print(store.node_info(kg, hit.name).as_text(), markup=False, highlight=False)

        with timer(f"4. The six agents with {spec}"):
            model = _load_model(spec, console)
            runs = [(agent, hotpot, {"corpus": corpus}) for agent in TEXT_AGENTS] + [
                (agent, paths, {"graph": kg}) for agent in KG_AGENTS]
            correct = sum(_agent(agent, items, model, store, source, console) for agent, items, source in runs)
    console.rule()
    console.print(f"[bold]{correct} of {len(runs)} agents answered correctly[/] (every answer F1 >= {CORRECT_F1}); "
                  f"total time {_clock(time.perf_counter() - started)} ({timer.summary()})", highlight=False)
    console.print(f"Use this store with the CLI: export MHQA_STORE={store.uri}, then --corpus {corpus} or --graph {kg}",
                  markup=False, highlight=False)
    return correct


def _load_model(spec: str, console: Console) -> Any:
    """The chat model, its pack file assembled (and for transformers converted) once with a progress bar."""
    from .models.factory import load_chat_model
    from .models.packs import PACKS, gguf_path, pull

    scheme, _, rest = spec.partition(":")
    pack = rest.partition("?")[0] if scheme == "llamacpp" else spec
    if pack in PACKS:
        prepare = gguf_path if scheme == "llamacpp" else pull
        with _bar(console, f"model {pack}: assemble and verify (first run only)", None, download=True) as tick:
            prepare(pack, progress=lambda stage, done, total: tick(done, total))
    started = time.perf_counter()
    with console.status(Text(f"loading {spec}")):
        model = load_chat_model(spec, **({} if scheme == "fake" else {"max_new_tokens": SETTINGS["max_new_tokens"]}))
    console.print(f"  model: {spec} loaded ({time.perf_counter() - started:.1f} s)", markup=False, highlight=False)
    return model


def _agent(agent: str, items: list[QAItem], model: Any, store: KnowledgeStore, source: dict,
           console: Console) -> bool:
    """`agent` answers `items`, showing its steps and each answer beside the gold one; True if all are correct."""
    from .graphs import build_graph, make_context

    graph = build_graph(agent)
    context = make_context(agent, llm=model, store=store, **SETTINGS, **source)
    all_correct = True
    for item in items:
        console.print(Text.assemble((agent, "bold cyan"), " Q: ", item.question), highlight=False)
        started = time.perf_counter()
        state: dict = {}
        with console.status(f"{agent}: starting") as status:
            for mode, chunk in graph.stream(graph_inputs(item), context=context, stream_mode=["updates", "values"]):
                if mode == "values":
                    state = chunk
                else:
                    status.update(Text(f"{agent}: {', '.join(chunk)} done ({time.perf_counter() - started:.0f} s)"))
        for line in steps(agent, state, item):
            console.print(f"    {line}", markup=False, highlight=False, style="dim")
        answer = state.get("answer") or ""
        em, f1 = score(answer, item.answers)
        all_correct &= f1 >= CORRECT_F1
        mark = ("correct", "green") if f1 >= CORRECT_F1 else ("wrong", "red")
        note = (f"  ({state['error']})", "yellow") if state.get("error") else ""
        console.print(Text.assemble(f"    answer: {answer!r}   gold: {item.answers[0]!r}   EM {em:.0f} F1 {f1:.2f} ",
                                    mark, f" ({time.perf_counter() - started:.1f} s)", note), highlight=False)
    return all_correct


def steps(agent: str, state: dict, item: QAItem) -> list[str]:
    """What the agent did, from its output, as its design's spec shows it (`demo_lines`): OPERA's plan and
    sub-goals, Mujica's DAG by level, Omne's tool calls, rag's retrieved passages (supporting titles marked *),
    auto's stages and decisions."""
    spec = spec_of(agent)
    return spec.demo_lines(state, item.supporting_titles) if spec else []
