"""Run an agent over a benchmark file: K questions in flight, one JSON record per question.

Records are appended to `out_dir/results.jsonl`, each with one `write()` of a whole line then
flush and fsync, so a killed process leaves only complete records (and at worst a torn last line,
which a rerun cuts off). A rerun skips the ids already recorded: runs are resumable and never
duplicate a question. A question that raises, or whose record cannot be made, is recorded with its
error; the run goes on. While an eval writes a folder it holds the folder's lock (`.lock`): a second
eval into it raises RunLocked.

`out_dir/run.json` records what the folder is a run of: agent, llm, dataset, file and the agent's
settings. A rerun asking for anything else raises RunMismatch instead of mixing two runs' records
(`force_new=True` starts the folder afresh); `limit`, `start` and `concurrency` may change, so a
rerun can extend a run. Ctrl-C (SIGINT) stops the run at once: the questions in flight are
dropped (a rerun asks them again), `summary.json` covers the records written so far, and
EvalInterrupted says how far it got.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

from filelock import FileLock, Timeout
from langchain_core.language_models import BaseChatModel
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from ..designs import spec_of
from ..errors import IngestError, InvalidInput, MhqaError
from ..ingest.datasets import QAItem, check_dataset_file, questions
from ..paths import file_sha256, read_json_object
from ..redaction import redact
from ..store import open_store
from ..text import encodable
from ..traces import Trace, TraceRecorder
from .diagnostics import chain_json, diagnose
from .environments import open_environment
from .health import health
from .report import RESULTS, SUMMARY, SUMMARY_FIELDS, Summary, read_records, summarize, summary_table
from .scoring import score

log = logging.getLogger(__name__)

MANIFEST = "run.json"
RUN_LOCK = ".lock"


class RunMismatch(MhqaError):
    """The run folder holds a run of another agent, model, dataset, file or settings."""


class RunLocked(MhqaError):
    """Another eval is writing the run folder."""


class EvalInterrupted(Exception):
    """SIGINT stopped the run after `done` of `total` questions; `summary.json` covers those."""

    def __init__(self, done: int, total: int) -> None:
        super().__init__(f"interrupted at {done}/{total}; rerun the same command to resume")
        self.done, self.total = done, total


def make_record(item: QAItem, output: dict | None, latency: float, trace: Trace, error: str | None = None) -> dict:
    """The results.jsonl record of one question, with the fields the agent's design spec adds (`record_fields`).
    `output` is the graph's output (None if the run raised `error`); `trace` is what the TraceRecorder saw of the
    run."""
    usage = trace.usage()
    prediction = (output or {}).get("answer") or ""
    em, f1 = score(prediction, item.answers) if error is None else (0.0, 0.0)
    record = {
        "id": item.id,
        "question": item.question,
        "answers": list(item.answers),
        "prediction": prediction,
        "em": em,
        "f1": f1,
        "error": redact(error or (output or {}).get("error")),
        "failed": error is not None,
        "latency": round(latency, 4),
        "llm_calls": usage["llm_calls"],
        "llm_calls_cached": usage["llm_calls_cached"],
        "tokens": usage["tokens"],
        "type": item.type,
        "level": item.level,
        "hops": item.hops,
        "supporting_ids": list(item.supporting_ids),
        "supporting_titles": list(item.supporting_titles),
        "topic_entities": list(item.topic_entities),
        "chain": chain_json(item.chain),
        "diagnostics": diagnose(item.chain, trace, em, f1, failed=error is not None),
        "trace": trace.model_dump(mode="json"),
    }
    if output is not None and (spec := spec_of(trace.agent)):  # rag's confidence, auto's route
        record |= spec.record_fields(output, trace)
    record["health"] = health(record, trace)
    return record


NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # a symlink planted in a run folder is refused, not followed


def open_new(path: Path) -> IO[str]:
    """A text file made afresh at `path`, open for writing: whatever was there (a symlink included) is removed first,
    and the file is created exclusively (O_EXCL, O_NOFOLLOW), so nothing outside its folder is written through it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644), "w", encoding="utf-8")


def write_new(path: Path, text: str) -> None:
    """Write `text` to a file made afresh at `path` (`open_new`)."""
    with open_new(path) as f:
        f.write(text)


class ResultsWriter:
    """Appends complete records to a JSONL file: one write of a full line, flush, fsync, under a lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file = os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, 0o644), "ab")

    def write(self, record: dict) -> None:
        line = encodable(json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")  # a lone surrogate: U+FFFD
        with self._lock:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:  # not in the middle of a write
            self._file.close()


def cut_torn_line(path: Path) -> int:
    """Truncate a partial last line (no newline) left by a killed writer; returns bytes removed."""
    if not path.exists():
        return 0
    with os.fdopen(os.open(path, os.O_RDWR | NOFOLLOW), "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        keep, pos = 0, size
        while pos > 0:  # find the last newline, reading backwards in blocks
            start = max(0, pos - 65536)
            f.seek(start)
            block = f.read(pos - start)
            i = block.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        f.truncate(keep)
        return size - keep


def load_questions(dataset: str, path: str | Path, limit: int | None = None, start: int = 0) -> list[QAItem]:
    """`limit` questions of the file (all if None) from the `start`-th unique id on; malformed rows and rows that
    repeat an earlier id skipped, with one warning each that counts them and names the first."""
    if start < 0:
        raise InvalidInput(f"start must be >= 0, got {start}")
    check_dataset_file(dataset, path)
    items: dict[str, QAItem] = {}
    bad: list[IngestError] = []
    repeated: list[str] = []
    for item in questions(dataset, path, yield_errors=True):
        if isinstance(item, IngestError):
            bad.append(item)
            continue
        if item.id in items:
            repeated.append(item.id)
            continue
        items[item.id] = item
        if limit is not None and len(items) >= start + limit:
            break
    if bad:
        log.warning("%d malformed question row%s skipped (the first: %s)", len(bad), "s" * (len(bad) > 1), bad[0])
    if repeated:
        many = len(repeated) > 1
        log.warning("%d question row%s skipped: %s an earlier row's id (the first: %r); the first row of an id is "
                    "asked", len(repeated), "s" * many, "they repeat" if many else "it repeats", repeated[0])
    if len(items) <= start:
        raise InvalidInput(f"no questions in {path} as {dataset}" + (f" from #{start} on" if start else ""))
    return list(items.values())[start:]


def graph_inputs(item: QAItem) -> dict:
    """The graph input of a question: the question, and the entities it names where the dataset
    knows them (KGQA practice; never bridge entities, which would give the chain away)."""
    if item.topic_entities:
        return {"question": item.question, "topic_entities": list(item.topic_entities)}
    return {"question": item.question}


def _describe(value: Any) -> Any:
    """A setting as the manifest records it: JSON values as they are (strings with their secrets masked: `redact`),
    objects (a chat model, a store) by their class name."""
    if isinstance(value, str):
        return redact(value)  # a spec's or URI's secrets stay out of run.json
    if value is None or isinstance(value, (int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in value.items()}
    return type(value).__name__


def repeats(context: Any) -> str:
    """Whether a rerun of this run gives the same answers, as its summary says it (docs/guide.md, "Results that
    repeat")."""
    specs = [context.llm, *context.role_llms.values()]
    if context.llm_cache:
        return f"yes, through the call cache {redact(str(context.llm_cache))}, on any machine"
    if not all(isinstance(s, str) for s in specs):
        return "unknown: a chat model object"
    if any(s.startswith("openai:") or "slots=" in s for s in specs):
        return "no: a served model batches or samples calls as it likes; use --llm-cache"
    if any(s.startswith("llamacpp:") and "chunk=0" in s for s in specs):
        return "no: chunk=0 computes a reply by what ran before it"
    return "yes, on this machine (another CPU computes other floats: use --llm-cache)"


def run_manifest(agent: str, dataset: str, path: str | Path, llm: Any, settings: dict) -> dict:
    """What a run folder is a run of (see the module docstring)."""
    from ..models.factory import default_chat_spec

    if llm in (None, "", "auto"):
        llm = default_chat_spec() or "auto"
    return {"agent": agent, "llm": _describe(llm), "dataset": dataset, "file": str(Path(path).resolve()),
            "file_sha256": file_sha256(path), "settings": _describe(dict(sorted(settings.items())))}


@contextmanager
def locked_run_folder(out_dir: Path) -> Iterator[None]:
    """Hold the run folder's lock (created with the folder) for the block; RunLocked if another eval holds it.
    The lock is the operating system's: a killed eval leaves none behind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(out_dir / RUN_LOCK, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunLocked(f"{out_dir} is being written by another eval; wait for it to end, or use another --out") \
            from None
    try:
        yield
    finally:
        lock.release()


def claim_run_folder(out_dir: Path, manifest: dict, force_new: bool = False) -> None:
    """Make `out_dir` a run folder of `manifest`: new, the same run (resumed), or with `force_new`
    emptied of an earlier run; RunMismatch if it holds another run."""
    path = out_dir / MANIFEST
    for name in (RESULTS, SUMMARY, MANIFEST):
        if (out_dir / name).is_symlink():
            raise InvalidInput(f"{out_dir / name} is a symbolic link; a run folder's files are not followed out of "
                               "it: remove the link, or use another --out")
    if force_new:
        for name in (RESULTS, SUMMARY, MANIFEST):
            (out_dir / name).unlink(missing_ok=True)
    elif path.exists():
        recorded = read_json_object(path, "a run's record", RunMismatch,
                                    "use another --out, or --force-new to start it afresh")
        changed = [f"{key} {recorded.get(key)!r} -> {value!r}" for key, value in manifest.items()
                   if key in recorded and recorded[key] != value]  # a key a folder predates is not compared
        if changed:
            raise RunMismatch(f"{out_dir} holds another run ({'; '.join(changed)}); use another --out, "
                              "or --force-new to start it afresh")
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    write_new(tmp, json.dumps(manifest, ensure_ascii=False, indent=2))
    os.replace(tmp, path)


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every task of `loop` and let each end: the run's, and the clean-ups (callbacks, exit stacks) that
    cancelling it starts, so that none is destroyed pending (asyncio's warnings) when the loop closes. A task
    that the interrupt struck re-raises it once more as the tasks awaiting it end (asyncio does so for
    KeyboardInterrupt); that is the same Ctrl-C, and the draining goes on."""
    while tasks := asyncio.all_tasks(loop):
        for task in tasks:
            task.cancel()
        try:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        except KeyboardInterrupt:
            pass
    loop.run_until_complete(loop.shutdown_asyncgens())


def _interruptible(main: Any, workers: int) -> None:
    """Run coroutine `main` on a new event loop whose executor has `workers` threads. On Ctrl-C or an error
    (a full disk), cancel it and return at once, without waiting for the threads still running (their results
    are dropped), then raise it: no task is left pending."""
    loop = asyncio.new_event_loop()
    executor = ThreadPoolExecutor(max_workers=workers)
    loop.set_default_executor(executor)
    run = loop.create_task(main)
    try:
        loop.run_until_complete(run)
    except BaseException:  # Ctrl-C, or a failure no question owns (a write error): drain every task first
        _cancel_all(loop)
        if run.done() and not run.cancelled():
            run.exception()  # raised here: not left to be logged as never retrieved
        raise
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        loop.close()


def _progress(enabled: bool) -> Progress:
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("failed {task.fields[failed]}  EM {task.fields[em]:.1f}  F1 {task.fields[f1]:.1f}"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]
    return Progress(*columns, console=Console(stderr=True), disable=not enabled)


async def _answer(graph: Any, agent: str, context: Any, item: QAItem) -> dict:
    """The record of one question. Any failure, of the run or of making its record, is the question's error."""
    recorder = TraceRecorder(agent, context)
    start = time.perf_counter()
    output, error = None, None
    try:
        output = await graph.ainvoke(graph_inputs(item), context=context, config={"callbacks": [recorder]})
    except Exception as exc:  # any failure of one question is recorded, the run goes on (redacted there)
        error = f"{type(exc).__name__}: {exc}"
    try:
        return make_record(item, output, time.perf_counter() - start, recorder.trace(output, error), error)
    except Exception as exc:  # an output that cannot be traced or scored: recorded without it
        error = redact(f"{type(exc).__name__}: {exc}")
        trace = Trace(agent=agent, question=encodable(item.question), error=error)
        return make_record(item, None, time.perf_counter() - start, trace, error)


async def _run_all(graph: Any, agent: str, context: Any, todo: Iterable[QAItem], done: list[dict],
                   writer: ResultsWriter, concurrency: int, bar: Progress, task: Any) -> None:
    tally = {"n": len(done), "failed": sum(1 for r in done if r.get("failed")),
             "em": sum(r["em"] for r in done), "f1": sum(r["f1"] for r in done)}

    def show() -> None:
        n = max(1, tally["n"])
        bar.update(task, failed=tally["failed"], em=100 * tally["em"] / n, f1=100 * tally["f1"] / n)

    queue = iter(todo)

    async def worker() -> None:  # K workers take the next question in turn: K tasks, however many questions
        for item in queue:
            record = await _answer(graph, agent, context, item)
            await asyncio.to_thread(writer.write, record)  # fsync off the event loop
            tally["n"] += 1
            tally["failed"] += record["failed"]
            tally["em"] += record["em"]
            tally["f1"] += record["f1"]
            bar.advance(task)
            show()

    show()
    await asyncio.gather(*(worker() for _ in range(concurrency)))


def run_eval(agent: str, dataset: str, path: str | Path, llm: str | BaseChatModel | None, store_uri: str | None,
             out_dir: str | Path, limit: int | None = None, concurrency: int = 4,
             context_overrides: dict | None = None, progress: bool = True, start: int = 0,
             force_new: bool = False, ids: Iterable[str] | None = None) -> Summary:
    """Evaluate `agent` on `limit` questions of a dataset file (from the `start`-th on) and return the summary.

    The store (created if missing) gets the dataset's environment first (see `environments.prepare`),
    unless `context_overrides` names a `corpus` or `graph` already in it. Results go to
    `out_dir/results.jsonl` (resumed if present and of the same run, see the module docstring) and
    the summary to `out_dir/summary.json`. `context_overrides` are extra agent settings (they may
    hold objects, e.g. a chat model as `llm`). `ids`: only these questions of the slice (InvalidInput if one
    is not in it). Raises EvalInterrupted on Ctrl-C.
    """
    from ..graphs import build_graph, check_sources, make_context

    if not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidInput(f"concurrency must be a positive integer, got {concurrency!r}")
    overrides = {k: v for k, v in (context_overrides or {}).items() if v is not None}  # None keeps the default
    given = {k: v for k, v in overrides.items() if k in ("corpus", "graph") and v}
    make_context(agent, require_source=False, **{"llm": llm, **overrides})  # before any work; the source: below
    out_dir = Path(out_dir)
    items = load_questions(dataset, path, limit, start)
    if ids is not None:
        only = set(ids)
        if unknown := only - {item.id for item in items}:
            raise InvalidInput(f"{len(unknown)} id(s) are not questions of the slice asked, "
                               f"e.g. {sorted(unknown)[0]!r}")
        items = [item for item in items if item.id in only]
    graph = build_graph(agent)
    settings = {k: v for k, v in overrides.items() if k not in ("llm", "llm_cache")}  # a cache changes no answer
    started = time.perf_counter()
    console = Console(stderr=True)
    with ExitStack() as stack:
        stack.enter_context(locked_run_folder(out_dir))
        claim_run_folder(out_dir, run_manifest(agent, dataset, path, overrides.get("llm", llm), settings), force_new)
        results = out_dir / RESULTS
        if given:
            store = stack.enter_context(open_store(store_uri, create=False, read_only=True))
            env = {"corpus": given.get("corpus"), "graph": given.get("graph"), "ingested": False}
        else:
            announce = stack.enter_context(_IngestBar(console, progress))
            store, env = stack.enter_context(open_environment(store_uri, dataset, path, announce))
        settings = {"llm": llm, "corpus": env["corpus"], "graph": env["graph"], **overrides}
        context = make_context(agent, store=store, **settings)
        check_sources(context)
        cut_torn_line(results)
        wanted = {item.id for item in items}
        done = [r for r in read_records(results, keep=("id", "failed", "em", "f1")) if r["id"] in wanted]
        finished = {r["id"] for r in done}
        todo = [item for item in items if item.id not in finished]
        writer = ResultsWriter(results)
        interrupted, write_error = False, None
        try:
            with _progress(progress) as bar:
                task = bar.add_task(escape(f"{agent} {Path(path).name}"), total=len(items), completed=len(done),
                                    failed=0, em=0.0, f1=0.0)
                # sync graph nodes run in the loop's executor: room for K questions and their parallel branches
                _interruptible(_run_all(graph, agent, context, todo, done, writer, concurrency, bar, task),
                               workers=4 * concurrency + 4)
        except KeyboardInterrupt:
            interrupted = True
        except OSError as exc:  # a record could not be written (ENOSPC, EIO): the summary of what was, then stop
            interrupted, write_error = True, exc
        finally:
            try:
                writer.close()
            except OSError as exc:
                interrupted, write_error = True, write_error or exc
        records = [r for r in read_records(results, keep=SUMMARY_FIELDS) if r["id"] in wanted]
        summary = summarize(records, agent=agent, dataset=dataset, file=str(path), repeats=repeats(context),
                            llm=_describe(context.llm), environment=env,
                            wall_time=round(time.perf_counter() - started, 3))
        tmp = out_dir / (SUMMARY + ".tmp")
        try:
            write_new(tmp, json.dumps(summary.as_dict() | {"complete": not interrupted, "questions": len(items)},
                                      ensure_ascii=False, indent=2))
            os.replace(tmp, out_dir / SUMMARY)
        except OSError:
            if write_error is None:
                raise  # else the disk is still full: the write error is what to report
        if write_error is not None:
            raise write_error
        if interrupted:
            raise EvalInterrupted(len(records), len(items))
    if progress:
        table = summary_table(summary)
        caption, table.caption = table.caption, None  # at the console's width, not wrapped to the narrow table's
        Console().print(table, caption)
    return summary


class _IngestBar:
    """`prepare`'s announce callback: says that an ingest starts and shows its progress bar until exit."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.console, self.enabled, self.bar = console, enabled, None

    def __enter__(self) -> _IngestBar:
        return self

    def __call__(self, what: str, total: int) -> Any:
        self.console.print(Text.assemble((what, "bold"), " (once; later runs reuse it)"), highlight=False,
                           soft_wrap=True)
        if not self.enabled:
            return None
        self.bar = Progress(TextColumn("[bold]ingest"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=self.console)
        task = self.bar.add_task("ingest", total=total)
        self.bar.start()
        return lambda done: self.bar.update(task, completed=done)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
