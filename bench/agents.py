"""Every agent side by side on the same dev questions, with a real model: quality, cost and protocol health.

    python bench/agents.py --quick                       # 4 questions on PQ-2H and HotpotQA dev_b (~35 min, 2 cores)
    python bench/agents.py --env pq2h --env hotpot --limit 20 [--start 0] [--agents rag,omne]
                           [--llm llamacpp:qwen2.5-coder-1.5b] [--jobs 2] [--out bench/out]
    python bench/agents.py --start 100 --limit 40 --agents rag,rag:decoding=prompt,omne,omne:guards=none
    python bench/agents.py --start 100 --limit 40 --summary [--out bench/out]   # the tables across environments

An agent may carry settings after a colon (`omne:guards=none`, `mujica:guards=unecho;guard_mode=log`,
`rag:decoding=prompt`): each such variant is a row of its own, with its own run folder. `--guards X`
adds `agent:guards=X` for every agent, so each table has the guards-off row beside the default;
`--guards each` adds one row per guard that fired in the default run, with that guard alone off.

A variant that only turns guards off runs after its default and re-asks only the questions on which one
of those guards fired there. Decoding is greedy, so a question on which none of them fired takes the
same path without them: its record is carried over from the default run, marked `"carried"`. Greedy
llama.cpp decoding is close to, not exactly, repeatable: of the Omne questions 100-139 on which no guard fired,
87 of 87 gave the same trace when re-asked; unconstrained Mujica runs of 2026-11-24 repeated 34 of 37.

Each (environment, agent) pair is one `mhqa eval` run in `OUT/runs/<llm>/<env>/<agent>`, so a rerun
resumes where it stopped and reuses finished questions; stopping the bench (Ctrl-C, SIGTERM) stops its
evals with it. `--jobs` runs that many evals at once, each
with one llama.cpp thread. The tables compare agents on the questions of the asked range (`--start`,
`--limit`) that all of them answered:
EM, F1, ΔF1 against `rag` measured in the same run, seconds and LLM calls per question, protocol
health (the agent acted as designed, invented tool results, malformed runs, repairs, forced
answers, empty or over-long answers) and the failure classes of the misses (eval/diagnostics.py).
They go to stdout and `OUT/agents.md`; `OUT/agents.png` plots F1 and EM, ΔF1, seconds and calls per
question, and how often each agent acted as designed.

`--summary` runs nothing and prints, from the run folders, the tables across environments that
docs/benchmarks.md opens with (also to `OUT/summary.md`): F1 and ΔF1 against `rag` per environment and agent,
what each guards-off variant's guards carry pooled over the environments of a kind, the targets met or missed,
and seconds, calls and tokens per question.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mhqa_graph.graphs import context_schema

from mhqa_graph.eval.environments import DEV_ENVIRONMENTS, ensure_worked_plans, open_environment
from mhqa_graph.eval.report import RESULTS, read_records
from mhqa_graph.eval.report import carry_over as carry_records
from mhqa_graph.eval.scoring import score

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/'s modules import each other by name
import records as R  # noqa: E402  (the committed per-question records)
from doc import write_doc  # noqa: E402  (docs/benchmarks.md's generated blocks)
from tables import env_rows, markdown, plot, summary  # noqa: E402
from variants import (  # noqa: E402  (the agents, their variants, the questions asked)
    AGENTS,
    DATA,
    DESIGNS,
    KG_ONLY,
    SETTINGS,
    SLICES,
    asked_ids,
    asked_range,
    environments,
    guards_off,
    parse_variant,
    slice_results,
    span,
    split_agents,
)

QUICK = (("pq2h", "hotpot"), 4)


def run_dir(out: Path, llm: str, env: str, agent: str) -> Path:
    return out / "runs" / re.sub(r"[^\w.-]+", "_", llm) / env / re.sub(r"[^\w.=;,-]+", "_", agent)


def eval_command(args: argparse.Namespace, env: str, variant: str, only: set[str] | None = None) -> list[str]:
    """The `mhqa eval` of one (environment, variant); `only`: the ids of the range it must still ask (the others
    are in the committed records), when fewer than the range."""
    spec = DEV_ENVIRONMENTS[env]
    agent, settings = parse_variant(variant)
    llm = args.llm if "?" in args.llm or not args.llm.startswith("llamacpp:") else f"{args.llm}?threads=1"
    mhqa = str(Path(sys.executable).with_name("mhqa"))
    flags = [f"{SETTINGS[key]}={value}" if key in SETTINGS else f"--set={key}={value}"  # "=": a value may start
             for key, value in settings.items()]  # with "-"
    return [mhqa, "eval", str(args.data / spec.file), "--dataset", spec.dataset, "--agent", agent,
            "--llm", llm, "--store", args.store, "--limit", str(span(args, env)[1]), "--start", str(span(args, env)[0]),
            "--concurrency", "1", *flags, "--out", str(run_dir(args.out, args.llm, env, variant)),
            *(["--ids", ",".join(sorted(only))] if only and only != asked_ids(args, env) else []),
            *(["--llm-cache", str(args.llm_cache)] if getattr(args, "llm_cache", None) else [])]


def carry_over(args: argparse.Namespace, env: str, variant: str) -> int:
    """Copy into `variant`'s run folder the records of its default run (see `guards_off`) on which none of
    the guards it turns off fired, for the asked questions it has not answered (`report.carry_over`); returns
    how many."""
    found = guards_off(variant)
    if not found:
        return 0
    base, off = found
    return carry_records(run_dir(args.out, args.llm, env, base), run_dir(args.out, args.llm, env, variant),
                         asked_ids(args, env), off, base)


def from_auto(args: argparse.Namespace, env: str, variant: str) -> int:
    """Copy into a design's run folder, for the asked questions it has not answered, what auto's run got from
    that design: auto runs the design as a subgraph with the same model and settings (greedy decoding), so
    the design's stage is the design's run on that question. Its answer, scored against the gold one, its calls,
    seconds and tokens; health, diagnostics and plan are the whole auto run's (rag's stage adds no guard, plan
    or forced answer). Each record is marked `carried: "auto"`; returns how many."""
    agent, settings = parse_variant(variant)
    if settings or agent not in DESIGNS:
        return 0
    target = run_dir(args.out, args.llm, env, variant)
    wanted = asked_ids(args, env) - {r["id"] for r in read_records(target / RESULTS)}
    rows = []
    for r in read_records(run_dir(args.out, args.llm, env, "auto") / RESULTS):
        route = r.get("route") or {}
        stage = next((s for s in route.get("stages") or [] if s.get("stage") == agent), None)
        said = next((d for d in route.get("decisions") or [] if d.get("stage") == agent), None)
        if r["id"] not in wanted or r.get("failed") or not stage or not said or "error" in said.get("action", "") \
                or stage.get("start_from"):  # handed rag's entities: not the design's own run
            continue
        em, f1 = score(said.get("answer") or "", r.get("answers") or [])
        rows.append({k: v for k, v in r.items() if k != "route"} | {
            "prediction": said.get("answer") or "", "em": em, "f1": f1, "latency": stage["seconds"],
            "llm_calls": stage["calls"], "tokens": stage["tokens"], "carried": "auto"})
    if rows:
        target.mkdir(parents=True, exist_ok=True)
        with (target / RESULTS).open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)


def fired_guards(args: argparse.Namespace, env: str, variant: str) -> list[str]:
    """The guards that fired in `variant`'s run on the asked questions, most frequent first."""
    wanted = asked_ids(args, env)
    counts: dict[str, int] = {}
    for r in R.load(R.path_of(args.llm, env, variant, args.results)):
        if r["id"] in wanted:
            for name in (r.get("health") or {}).get("guards") or {}:
                counts[name] = counts.get(name, 0) + 1
    return sorted(counts, key=lambda n: (-counts[n], n))


def build_environments(store: str, data: Path, envs: Iterable[str], plans: bool = False) -> None:
    """Ingest each environment into `store` once, so that evals can then open it read-only side by side; with
    `plans`, the worked plans too (a variant sets plan_examples)."""
    for env in envs:
        spec = DEV_ENVIRONMENTS[env]
        with open_environment(store, spec.dataset, data / spec.file) as (opened, built):
            print(f"  environment {env}: {'ingested' if built['ingested'] else 'ready'}", file=sys.stderr)
            if plans:
                ensure_worked_plans(opened, data)


# -- child processes ------------------------------------------------------------------------
_live: set[subprocess.Popen] = set()
_stopping = threading.Event()


def start(cmd: list[str], **popen: object) -> subprocess.Popen:
    """Start `cmd` as a child that `stopping_children` stops with the bench; InterruptedError once it stops."""
    if _stopping.is_set():
        raise InterruptedError("the bench is stopping")
    proc = subprocess.Popen(cmd, **popen)
    _live.add(proc)
    if _stopping.is_set():  # the bench began to stop while this one started
        proc.terminate()
    return proc


def wait(proc: subprocess.Popen) -> int:
    """`proc`'s exit code, once it has ended."""
    try:
        return proc.wait()
    finally:
        _live.discard(proc)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def stopping_children() -> Iterator[None]:
    """On Ctrl-C or SIGTERM (or any error) in the block, start no further child and stop the running ones, so
    that no eval outlives the bench holding its run folder's lock. Each eval keeps the questions it finished;
    a rerun resumes them."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    except BaseException:
        _stopping.set()
        for proc in list(_live):
            proc.terminate()
        for proc in list(_live):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_all(args: argparse.Namespace, jobs: list[tuple[str, str]]) -> None:
    """The evals of `jobs`, `args.jobs` at a time; each one's output goes to its run folder's eval.log.
    The environments are built first, so that the evals open the shared store read-only side by side.
    Variants that turn guards off run after the others, on what `carry_over` leaves them."""
    build_environments(args.store, args.data, dict.fromkeys(env for env, _ in jobs),
                       plans=any("plan_examples" in parse_variant(v)[1] for _, v in jobs))

    def run(job: tuple[str, str]) -> None:
        if _stopping.is_set():
            return
        path = R.path_of(args.llm, *job, root=args.results)
        missing = asked_ids(args, job[0]) - {r["id"] for r in R.load(path)}
        if not missing:
            print(f"  {job[0]}/{job[1]}: every question is in {path.name}, not asked again", file=sys.stderr)
            return
        carried = carry_over(args, *job) + from_auto(args, *job)
        if carried:
            print(f"  {job[0]}/{job[1]}: {carried} questions carried over", file=sys.stderr, flush=True)
        folder = run_dir(args.out, args.llm, *job)
        try:
            _run(eval_command(args, *job, only=missing), folder)
        finally:
            R.save(folder, path, stamp=getattr(args, "stamp", None))

    for phase in ([j for j in jobs if not guards_off(j[1])], [j for j in jobs if guards_off(j[1])]):
        with ThreadPoolExecutor(args.jobs) as pool, stopping_children():  # children stop before the pool joins
            for _ in pool.map(run, phase):
                pass


def _run(cmd: list[str], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with (folder / "eval.log").open("a", encoding="utf-8") as log:
        code = wait(start(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "160"}))
    print(f"  {folder.parent.name}/{folder.name}: exit {code} after {time.perf_counter() - started:.0f}s",
          file=sys.stderr, flush=True)


def sealed_stamp(args: argparse.Namespace, agents: list[str]) -> dict[str, Any]:
    """What a sealed run's records carry: the commit, a digest of the frozen settings (every agent's defaults and
    the model spec) and the reason of an `--unseal`, if one was given."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parent).stdout.strip()
    # a field made by a factory is written as the factory's value: `MISSING`'s repr holds an address
    defaults = {agent: {f.name: repr(f.default_factory() if f.default is dataclasses.MISSING else f.default)
                        for f in dataclasses.fields(context_schema(agent))}
                for agent in sorted({parse_variant(a)[0] for a in agents})}
    settings = json.dumps({"llm": args.llm, "variants": sorted(agents), "defaults": defaults}, sort_keys=True)
    return {"commit": commit + ("+changes" if dirty else ""),
            "settings": hashlib.sha256(settings.encode()).hexdigest()[:16], "unsealed": args.unseal}


def check_sealed(args: argparse.Namespace, agents: list[str]) -> str | None:
    """Why a run may not touch the sealed slice (a variant with settings, guards off, mechanisms), None if it may:
    the sealed slice is run with the frozen defaults only, unless `--unseal` gives a reason (recorded)."""
    if getattr(args, "slice", None) != "sealed" or args.unseal:
        return None
    changed = [a for a in agents if ":" in a] + (["--guards"] if args.guards else []) + \
        (["--mechanism"] if args.mechanism else [])
    if changed:
        return (f"the sealed slice runs the frozen defaults only, not {', '.join(changed)}; choose settings on "
                "--slice validation, or give --unseal REASON (recorded in every record)")
    return None


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of questions (1 or more)")
    return int(text)


def arguments() -> argparse.ArgumentParser:
    """The command line of this script (`main`, and the commands of the generated blocks bench/doc.py reads)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", action="append", choices=sorted(DEV_ENVIRONMENTS), help="repeatable; default: all")
    parser.add_argument("--agents", default=",".join(AGENTS), help="comma-separated")
    parser.add_argument("--llm", default="llamacpp:qwen2.5-coder-1.5b")
    parser.add_argument("--limit", type=positive, default=None, help="questions asked from --start (default 20); "
                        "with --slice, the first LIMIT questions of each environment's slice")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="4 questions on pq2h and hotpot")
    parser.add_argument("--jobs", type=int, default=2, help="evals at once (one model thread each)")
    parser.add_argument("--store", default=None, help="store URI (default: embedded store in OUT/store)")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--slice", choices=sorted(SLICES), default=None, help="ask each environment's slice "
                        "(SLICES) instead of --start: `validation` where defaults are chosen, `sealed` where "
                        "targets are read, with the frozen defaults only; its records go under RESULTS/sealed, with "
                        "the call cache of its model calls (RESULTS/sealed/<llm>/calls/calls.sqlite, or --llm-cache)")
    parser.add_argument("--unseal", metavar="REASON", default=None, help="with --slice sealed: run other variants "
                        "there too; the reason is recorded in every record of the run")
    parser.add_argument("--llm-cache", type=Path, default=None, help="call cache file every eval reads and fills "
                        "(`mhqa eval --llm-cache`): a rerun makes only the model calls whose key is new")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out", help="run folders, "
                        "the store and the reports (not committed)")
    parser.add_argument("--results", type=Path, default=R.RESULTS_DIR, help="the committed per-question records "
                        "(bench/records.py): the tables read them, a run asks only the questions they lack")
    parser.add_argument("--report-only", action="store_true", help="tables from finished runs, run nothing")
    parser.add_argument("--summary", action="store_true", help="the cross-environment tables of docs/benchmarks.md "
                        "(agent matrix, what the guards carry, targets, cost) from finished runs, to OUT/summary.md")
    parser.add_argument("--guards", default=None, help="also run every agent with these guards (e.g. none), "
                        "or 'each': every guard that fired, alone off")
    parser.add_argument("--mechanism", nargs=2, action="append", metavar=("BEFORE", "AFTER"), default=[],
                        help="with --summary, repeatable: compare two variants, e.g. --mechanism "
                        "auto:hand_over=false auto")
    parser.add_argument("--only-routes", action="store_true", help="with --summary: only what auto and its "
                        "variants did (a slice on which only they ran)")
    parser.add_argument("--only-mechanisms", action="store_true", help="with --summary: only the --mechanism "
                        "pairs' table, for a slice on which only they ran")
    parser.add_argument("--write-doc", type=Path, default=None, help="regenerate the generated blocks of this markdown "
                        "file (docs/benchmarks.md) from the records, run nothing")
    return parser


def main() -> None:
    parser = arguments()
    args = parser.parse_args()
    if args.write_doc:
        print(f"{write_doc(args.write_doc, args.results, args.data)} blocks regenerated in {args.write_doc}")
        return
    if args.quick:
        args.env, args.limit = list(QUICK[0]), QUICK[1]
    envs = environments(args)
    args.store = args.store or f"embedded://{(args.out / 'store').resolve()}"
    agents = split_agents(args.agents)
    args.results = slice_results(args)
    if args.summary:
        report = summary(args, envs, [a for a in agents if ":" not in a])
        print(report)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.md").write_text(report, encoding="utf-8")
        return
    if args.guards and args.guards != "each":
        agents += [f"{a}:guards={args.guards}" for a in agents if ":" not in a and a not in ("rag", "direct")]
    try:
        kinds = {a: parse_variant(a)[0] for a in agents}
    except ValueError as exc:
        parser.error(str(exc))
    if refused := check_sealed(args, agents):
        parser.error(refused)
    if args.slice == "sealed":
        args.stamp = sealed_stamp(args, agents)
        args.llm_cache = args.llm_cache or R.path_of(args.llm, "calls", "x", args.results).parent / "calls.sqlite"
    jobs = [(env, a) for env in envs for a in agents
            if not (kinds[a] in KG_ONLY and DEV_ENVIRONMENTS[env].kind != "kg")]
    started = time.perf_counter()
    if not args.report_only:
        run_all(args, jobs)
    if args.guards == "each":  # known once the default runs are done
        each = [(env, f"{a}:guards=-{name}") for env, a in jobs if ":" not in a for name in fired_guards(args, env, a)]
        if not args.report_only:
            run_all(args, each)
        jobs += each
    tables, text = {}, [f"## Agents side by side: `{args.llm}`, {asked_range(args)}\n"]
    for env in envs:
        n, rows = env_rows(args, env, [a for e, a in jobs if e == env])
        tables[env] = rows
        if rows:
            text.append(markdown(env, n, rows, args.llm))
    report = "\n".join(text)
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agents.md").write_text(report, encoding="utf-8")
    plot(tables, args.out / "agents.png")
    print(f"wrote {args.out / 'agents.md'} and {args.out / 'agents.png'} in {time.perf_counter() - started:.0f}s",
          file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the evals were stopped, each keeping what it finished
        print(f"stopped ({exc or 'interrupted'}): every eval keeps the questions it finished; rerun to resume",
              file=sys.stderr)
        sys.exit(130)
