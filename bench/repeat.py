"""Do runs repeat? One eval of an agent, made again three ways on this machine, every prediction compared:

    python bench/repeat.py --env pq2h --agent auto --start 140 --limit 20       # ~30 min on 2 cores, 1.5B
    python bench/repeat.py --report-only --env pq2h --agent auto               # the table of finished runs

1. `first`: the questions in order, one at a time (`-k 1`), into a fresh call cache.
2. `again`: the same questions at `-k 2`, after `--warm` other questions of the file have filled the model's
   prefix cache (and in the same model process), with no call cache: what llama.cpp computes anew.
3. `cached`: the same questions through the call cache of run 1: no model call at all.

It prints, per run, the predictions equal to run 1's, the model calls made and answered from the cache, and the
seconds; `--record FILE.json` writes the rows and run 1's predictions as JSON, and run 1's call cache beside it
(`FILE.calls.sqlite`, a few KB a question), both committed in bench/results/. Runs resume (`mhqa eval` run folders
under `--out`).

    python bench/repeat.py --replay bench/results/repeat-pq2h-auto.json     # another machine: seconds

    python bench/repeat.py --env pq2h --agent auto --start 240 --limit 60 \
        --against bench/results/sealed/llamacpp_qwen2.5-coder-1.5b/pq2h/auto.jsonl.gz

`--against` takes run 1 from a committed eval (its records and the call cache beside them, `calls/calls.sqlite`
one folder up) instead of asking it: runs 2 and 3 then check that eval itself, in the store it was made in.

`--replay` asks the recorded questions again through the committed call cache, on whatever machine this is, and
compares every prediction with the recorded ones: a run that repeats makes no model call and changes no answer. It
builds a store of its own, holding the record's environment only, as the recorded runs' store did: the embedded
store ranks entities and passages by word statistics of the whole store, so other collections in it change what a
search returns first, and with it the prompt.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from mhqa_graph.eval.environments import DEV_ENVIRONMENTS
from mhqa_graph.eval.report import RESULTS, read_records
from mhqa_graph.eval.runner import load_questions

BENCH = Path(__file__).resolve().parent
DATA = BENCH.parents[1] / "shared" / "data"

sys.path.insert(0, str(BENCH))  # bench/'s modules import each other by name
import records as R  # noqa: E402  (the committed per-question records)


def eval_run(args: argparse.Namespace, out: Path, start: int, limit: int, concurrency: int,
             cache: Path | None, ids: list[str] | None = None) -> None:
    """One `mhqa eval` of the asked agent into `out` (resumed if it is there)."""
    spec = DEV_ENVIRONMENTS[args.env]
    cmd = [str(Path(sys.executable).with_name("mhqa")), "eval", str(args.data / spec.file), "--dataset", spec.dataset,
           "--agent", args.agent, "--llm", args.llm, "--store", args.store, "--start", str(start), "--limit",
           str(limit), "--concurrency", str(concurrency), "--out", str(out),
           *(["--llm-cache", str(cache)] if cache else []), *(["--ids", ",".join(ids)] if ids else [])]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)}\nfailed: {done.stderr[-2000:]}")


def committed_cache(args: argparse.Namespace) -> Path:
    """The call cache beside the committed eval `--against` (RESULTS/<llm>/<env>/<agent>.jsonl.gz), once that path
    is checked to be a run of the asked environment, agent and model."""
    path, root = args.against, args.against.parents[2]
    named = {R.path_of(spec, args.env, args.agent, root) for spec in (args.llm, args.llm.partition("?")[0])}
    if path not in named:  # bench/agents.py names a run's folder by its --llm, without the ?threads=1 it adds
        raise SystemExit(f"{path}: not of --agent {args.agent} on --env {args.env} with --llm {args.llm}, whose "
                         f"records would be {' or '.join(map(str, sorted(named)))}")
    cache = path.parents[1] / "calls" / "calls.sqlite"
    if not cache.is_file():
        raise SystemExit(f"{cache}: no call cache beside the committed eval")
    return cache


def first_run(args: argparse.Namespace) -> dict[str, dict]:
    """Run 1's records by id: asked here, or those of the asked questions in the committed eval `--against`."""
    if not getattr(args, "against", None):
        return {r["id"]: r for r in read_records(args.out / "first" / RESULTS)}
    spec = DEV_ENVIRONMENTS[args.env]
    asked = {q.id for q in load_questions(spec.dataset, args.data / spec.file, limit=args.limit, start=args.start)}
    records = {r["id"]: r for r in R.load(args.against) if r["id"] in asked}
    if len(records) < len(asked):
        raise SystemExit(f"{args.against} answers {len(records)} of the {len(asked)} questions asked")
    return records


def rows(args: argparse.Namespace) -> list[dict]:
    """Each run against `first`: predictions equal, model calls made and cached, seconds."""
    first = first_run(args)
    runs = {"first": first, **{name: {r["id"]: r for r in read_records(args.out / name / RESULTS)}
                               for name in ("again", "cached")}}
    out = []
    for name, records in runs.items():
        ids = sorted(set(records) & set(first))
        if not ids:
            continue
        calls = sum(records[i].get("llm_calls") or 0 for i in ids)
        cached = sum(records[i].get("llm_calls_cached") or 0 for i in ids)
        out.append({"run": name, "questions": len(ids), "same": sum(records[i]["prediction"] == first[i]["prediction"]
                                                                   for i in ids),
                    "llm_calls": calls, "llm_calls_cached": cached, "model_calls": calls - cached,
                    "seconds": round(sum(records[i]["latency"] for i in ids), 1)})
    return out


def repo_path(path: Path) -> str:
    """`path` as the repository names it, where it is in the repository."""
    path = path.resolve()
    return str(path.relative_to(BENCH.parent)) if path.is_relative_to(BENCH.parent) else str(path)


def table_text(rec: dict) -> str:
    """The markdown table of a run's rows (`rows`) under a line naming what was repeated."""
    lines = [f"`{rec['agent']}` on {rec['env']} {rec['start']}..{rec['start'] + rec['limit'] - 1}, `{rec['llm']}`"
             + (f", against `{rec['against']}`" if rec.get("against") else "") + "\n",
             "| run | questions | predictions as run 1 | LLM calls | from the call cache | model calls | seconds |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['questions']} | {r['same']}/{r['questions']} | {r['llm_calls']} | "
              f"{r['llm_calls_cached']} | {r['model_calls']} | {r['seconds']} |" for r in rec["rows"]]
    return "\n".join(lines) + "\n"


def reports(args: argparse.Namespace) -> str:
    """The table of a committed `--record` file (`--show`), for docs/benchmarks.md's generated blocks."""
    path = args.show if args.show.is_absolute() else BENCH.parent / args.show
    return table_text(json.loads(path.read_text(encoding="utf-8")))


def arguments() -> argparse.ArgumentParser:
    """The command line of this script (`main`, and the commands of the generated blocks bench/doc.py reads)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", choices=sorted(DEV_ENVIRONMENTS), default="pq2h")
    parser.add_argument("--agent", default="auto")
    parser.add_argument("--llm", default="llamacpp:qwen2.5-coder-1.5b?threads=1")
    parser.add_argument("--start", type=int, default=140)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--warm", type=int, default=5, help="other questions asked first in run 2 (the prefix cache)")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--store", default=None, help="store URI (default: bench/out/store; with --replay, a fresh "
                        "store that holds the record's environment only, as its runs' did)")
    parser.add_argument("--out", type=Path, default=BENCH / "out" / "repeat")
    parser.add_argument("--record", type=Path, help="write the rows as JSON here")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--against", type=Path, help="a committed eval's records (RESULTS/<llm>/<env>/<agent>"
                        ".jsonl.gz, made in --store; the same --llm, --env and --agent): run 1, not asked again; run "
                        "3 replays a copy of the call cache one folder up (calls/calls.sqlite)")
    parser.add_argument("--replay", type=Path, help="a --record file: its questions through its committed call cache")
    parser.add_argument("--show", type=Path, help="a --record file (relative to the repository): its table, no run")
    parser.add_argument("--results", type=Path, help=argparse.SUPPRESS)  # what bench/doc.py passes every script
    return parser


def main() -> None:
    args = arguments().parse_args()
    if args.show:
        return print(reports(args))
    if args.replay:
        return replay(args)
    args.store = args.store or f"embedded://{BENCH / 'out' / 'store'}"
    args.out = args.out / args.env / args.agent
    cache = args.out / "calls.sqlite"
    if not args.report_only:
        args.out.mkdir(parents=True, exist_ok=True)  # bench/out too: the default store's parent
        if args.against:  # a copy (the committed cache stays as it is), consistent while a run writes to it
            with closing(sqlite3.connect(f"file:{committed_cache(args)}?mode=ro", uri=True)) as src, \
                    closing(sqlite3.connect(cache)) as copy:
                src.backup(copy)
        else:
            eval_run(args, args.out / "first", args.start, args.limit, 1, cache)
        # run 2 asks `--warm` earlier questions first, in the same eval (one model process), then the slice at -k 2
        warm = max(0, args.start - args.warm)
        eval_run(args, args.out / "again", warm, args.start - warm + args.limit, 2, None)
        eval_run(args, args.out / "cached", args.start, args.limit, 2, cache)
    rec = {"env": args.env, "agent": args.agent, "llm": args.llm, "start": args.start, "limit": args.limit,
           "warm": args.warm, "rows": rows(args), "against": args.against and repo_path(args.against)}
    print(table_text(rec))
    if args.record:
        first = {i: r["prediction"] for i, r in first_run(args).items()}
        args.record.write_text(json.dumps(rec | {"predictions": dict(sorted(first.items()))}, indent=2) + "\n",
                               encoding="utf-8")
        if not args.against:  # else the committed eval's call cache is the record's
            with sqlite3.connect(cache) as db:  # one self-contained file: the WAL folded in
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            shutil.copyfile(cache, args.record.with_suffix(".calls.sqlite"))


def replay(args: argparse.Namespace) -> None:
    """The questions of a --record file through its committed call cache: predictions and model calls."""
    recorded = json.loads(args.replay.read_text(encoding="utf-8"))
    if recorded.get("against"):
        raise SystemExit(f"{args.replay} checked the committed eval {recorded['against']}: replay that eval "
                         "instead, with bench/agents.py into an empty --results folder and --llm-cache a copy of "
                         "its committed call cache")
    args.env, args.agent, args.llm = recorded["env"], recorded["agent"], recorded["llm"]
    out = args.out / "replay" / args.replay.stem
    shutil.rmtree(out, ignore_errors=True)
    cache = out.parent / f"{args.replay.stem}.calls.sqlite"
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(args.replay.with_suffix(".calls.sqlite"), cache)  # the committed file stays as it is
    if not args.store:  # what else a store holds changes its lexical ranking, and so the prompts (docs/benchmarks.md)
        store = out.parent / f"{args.replay.stem}.store"
        shutil.rmtree(store, ignore_errors=True)
        args.store = f"embedded://{store}"
    eval_run(args, out, recorded["start"], recorded["limit"], 2, cache)
    records = {r["id"]: r for r in read_records(out / RESULTS)}
    same = sum(records[i]["prediction"] == p for i, p in recorded["predictions"].items() if i in records)
    calls = sum(r.get("llm_calls") or 0 for r in records.values())
    cached = sum(r.get("llm_calls_cached") or 0 for r in records.values())
    asked = len(recorded["predictions"])
    print(f"| replay of {args.replay.name} | questions | predictions as recorded | LLM calls | from the call cache |\n"
          f"|---|---|---|---|---|\n| {args.agent} on {args.env} | {len(records)} | {same}/{asked} | {calls} | "
          f"{cached} |")


if __name__ == "__main__":
    main()
