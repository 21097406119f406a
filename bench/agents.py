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
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mhqa_graph.graphs import context_schema
from mhqa_graph.graphs.guards import GUARDS, selected

from mhqa_graph.eval.diagnostics import FAILURE_CLASSES, failure_summary
from mhqa_graph.eval.environments import DEV_ENVIRONMENTS, ensure_worked_plans, open_environment
from mhqa_graph.eval.health import format_repairs, health_summary
from mhqa_graph.eval.paired import cluster_key, interval_and_detectable, paired_interval
from mhqa_graph.eval.paired import verdict as by_interval
from mhqa_graph.eval.report import RESULTS, prefilled_per_question, read_records
from mhqa_graph.eval.report import carry_over as carry_records
from mhqa_graph.eval.runner import load_questions
from mhqa_graph.eval.scoring import score
from mhqa_graph.plots import pyplot, save_png

sys.path.insert(0, str(Path(__file__).resolve().parent))
import records as R  # noqa: E402  (bench/records.py: the committed per-question records)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
AGENTS = ("direct", "rag", "opera", "mujica", "omne", "auto")
KG_ONLY = {"omne"}  # agents that need a knowledge graph


QUICK = (("pq2h", "hotpot"), 4)
SEALED_N = 150  # per KG environment: 450 pooled detect about 8 F1 points (docs/benchmarks.md, "The sealed slice")
# (start, limit) per environment. Defaults are chosen on the validation slice; targets are read once from the
# sealed slice, with the frozen defaults (`--slice sealed` refuses any other variant unless `--unseal` says why).
# 2Wiki text has 145 questions: its validation slice is 140..144 and it has no sealed slice.
SLICES = {"validation": {env: (140, 60) for env in DEV_ENVIRONMENTS},
          "sealed": {"pq2h": (240, SEALED_N), "pq3h": (240, SEALED_N), "2wiki-kg": (240, SEALED_N),
                     "hotpot": (240, 60)}}


# variant key -> eval flag; any other key is a setting of the agent, given as `--set key=value`
SETTINGS = {"decoding": "--decoding", "guards": "--guards", "guard_mode": "--guard-mode"}


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    """`omne:guards=none;guard_mode=log` -> ("omne", {"guards": "none", "guard_mode": "log"})."""
    agent, _, rest = spec.partition(":")
    settings = dict(item.split("=", 1) for item in rest.split(";") if "=" in item)
    known = set(SETTINGS) | ({f.name for f in dataclasses.fields(context_schema(agent))} if agent in AGENTS else set())
    unknown = sorted(set(settings) - known)
    if agent not in AGENTS or unknown or (rest and not settings):
        raise ValueError(f"bad agent {spec!r}: use <agent>[:key=value;...] with agent in {', '.join(AGENTS)} "
                         f"and keys in {', '.join(SETTINGS)} or the agent's settings (`mhqa eval --set`)")
    return agent, settings


def split_agents(text: str) -> list[str]:
    """`rag,opera:guards=-unecho,-options_line` -> ["rag", "opera:guards=-unecho,-options_line"]: a comma starts a
    new variant only where an agent's name follows it."""
    variants: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if variants and part.partition(":")[0] not in AGENTS:
            variants[-1] += "," + part
        elif part:
            variants.append(part)
    return variants


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


def _all_guards(agent: str) -> frozenset[str]:
    return frozenset(n for n, g in GUARDS.items() if agent in g.agents)


def guards_off(variant: str) -> tuple[str, frozenset[str]] | None:
    """(the variant this one differs from only in guards, the guards it turns off), if it only turns
    guards off; None otherwise (it turns none off, or logs instead of enforcing). `none` and `-name,...` are
    read against the default run, whatever the default set was when the two ran (run folders outlive a change
    of the default set): `none` turns off every guard of the agent, `-name` that guard."""
    agent, settings = parse_variant(variant)
    if "guards" not in settings or settings.get("guard_mode", "enforce") != "enforce":
        return None
    rest = {k: v for k, v in settings.items() if k != "guards"}
    names = [n.strip() for n in settings["guards"].split(",") if n.strip()]
    if settings["guards"] == "none":
        turned_off = _all_guards(agent)
    elif names and all(n[0] in "+-" for n in names):
        turned_off = {n[1:] for n in names if n[0] == "-"}
    else:
        turned_off = selected("auto", agent) - selected(settings["guards"], agent)
    off = frozenset(n for n in turned_off if n in GUARDS and agent in GUARDS[n].agents)
    if not off:
        return None
    return agent + (":" + ";".join(f"{k}={v}" for k, v in rest.items()) if rest else ""), off


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


# -- tables ----------------------------------------------------------------------------------
def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def asked_range(args: argparse.Namespace) -> str:
    """The questions asked, as the tables' headings say it."""
    if getattr(args, "slice", None):
        return f"the {args.slice} slice"
    return f"questions {args.start}..{args.start + args.limit - 1}"


def asked_ids(args: argparse.Namespace, env: str) -> set[str]:
    """The ids of the environment's questions asked (`span`)."""
    spec, (start, limit) = DEV_ENVIRONMENTS[env], span(args, env)
    return {q.id for q in load_questions(spec.dataset, args.data / spec.file, limit=limit, start=start)}


def span(args: argparse.Namespace, env: str) -> tuple[int, int]:
    """(first question, how many) asked of `env`: its slice's (`--slice`), else `--start` and `--limit`."""
    chosen = getattr(args, "slice", None)
    return SLICES[chosen][env] if chosen else (args.start, args.limit)


def sealed_stamp(args: argparse.Namespace, agents: list[str]) -> dict[str, Any]:
    """What a sealed run's records carry: the commit, a digest of the frozen settings (every agent's defaults and
    the model spec) and the reason of an `--unseal`, if one was given."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parent).stdout.strip()
    defaults = {agent: {f.name: repr(f.default) for f in dataclasses.fields(context_schema(agent))}
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


def env_rows(args: argparse.Namespace, env: str, agents: list[str]) -> tuple[int, list[dict]]:
    """(questions of the asked range that all agents' runs answered, one row of metrics per agent over
    those questions). A run folder may hold more questions, from earlier runs over other ranges."""
    records = {a: {r["id"]: r for r in R.load(R.path_of(args.llm, env, a, args.results))} for a in agents}
    records = {a: r for a, r in records.items() if r}
    if not records:
        return 0, []
    shared = set.intersection(asked_ids(args, env), *(set(r) for r in records.values()))
    if not shared:
        return 0, []
    rag_f1 = _mean([records["rag"][i]["f1"] for i in shared]) if "rag" in records else None
    rows = []
    for agent, by_id in records.items():
        recs = [by_id[i] for i in sorted(shared)]
        f1 = _mean([r["f1"] for r in recs])
        health = health_summary(r.get("health") for r in recs)
        diags = failure_summary(recs)
        rows.append({
            "agent": agent, "n": len(recs), "em": 100 * _mean([r["em"] for r in recs]), "f1": 100 * f1,
            "df1": None if rag_f1 is None else 100 * (f1 - rag_f1),
            "df1_ci": None if "rag" not in records else paired_interval(
                [by_id[i]["f1"] - records["rag"][i]["f1"] for i in sorted(shared)],
                clusters=[cluster_key(by_id[i]) for i in sorted(shared)]),
            "sec": _mean([r["latency"] for r in recs]), "calls": _mean([r["llm_calls"] for r in recs]),
            "tokens": _mean([r["tokens"]["total"] for r in recs]),
            "acted": f"{health['acted']}/{health['acted_of']}" if health["acted_of"] else "-",
            "acted_pct": 100 * health["acted"] / health["acted_of"] if health["acted_of"] else None,
            "invented": health["invented"], "malformed": health["malformed"], "repairs": health["repairs"],
            "forced": health["forced"], "bad": health["bad_answers"],
            "guarded": health.get("guard_changed", 0), "answer_guard": health.get("answer_guard", 0),
            "fired": health.get("guards", {}),
            "recall": diags["evidence_recall"], "failures": diags["failures"], "fill": _fill(recs),
            "carried": sum(1 for r in recs if r.get("carried")),
            "guards_share": _guards_share(agent, by_id, records, sorted(shared)),
        })
    return len(shared), rows


def _guards_share(variant: str, by_id: dict, records: dict, ids: list[str]) -> dict | None:
    """What the guards a variant turns off add to its default run (guards on minus off, per question): ΔF1 with
    its interval, questions better and worse, questions re-asked. None for other variants."""
    found = guards_off(variant)
    if not found or found[0] not in records:
        return None
    return {"off": ", ".join(sorted(found[1])), "base": found[0],
            **_share([(records[found[0]][i], by_id[i]) for i in ids])}


def _share(pairs: list[tuple[dict, dict]]) -> dict:
    """What guards add, from (guards on, guards off) records of the same questions: ΔF1 with its interval,
    questions better and worse with them, questions re-asked without them, calls and tokens per question."""
    diffs = [on["f1"] - off["f1"] for on, off in pairs]
    return {"n": len(pairs), "df1": 100 * _mean(diffs), "ci": paired_interval(diffs, clusters=_clusters(pairs)),
            "better": sum(d > 0 for d in diffs), "worse": sum(d < 0 for d in diffs),
            "reasked": sum(1 for _, off in pairs if not off.get("carried")),
            "calls": _mean([on["llm_calls"] - off["llm_calls"] for on, off in pairs]),
            "tokens": _mean([on["tokens"]["total"] - off["tokens"]["total"] for on, off in pairs])}


def _clusters(pairs: list[tuple[dict, dict]]) -> list[str]:
    """The cluster of each pair (eval/paired.cluster_key), by environment: `env` where the record says it."""
    return [f"{on.get('env', '')}/{cluster_key(on)}" for on, _ in pairs]


def _fill(records: list[dict]) -> str:
    """OPERA's placeholders resolved / written over the records ("-" for other agents)."""
    counts = [r.get("placeholders") for r in records]
    counts = [c for c in counts if isinstance(c, dict)]
    if not counts:
        return "-"
    return f"{sum(c.get('resolved', 0) for c in counts)}/{sum(c.get('written', 0) for c in counts)}"


def markdown(env: str, n: int, rows: list[dict], llm: str) -> str:
    spec = DEV_ENVIRONMENTS[env]
    head = (f"### {env}: {spec.dataset} `{Path(spec.file).name}` ({spec.kind}), {n} questions, `{llm}`\n\n"
            "| agent | EM | F1 | ΔF1 vs rag [95% CI] | s/q | LLM calls/q | tokens/q | acted | invented | malformed | "
            "repairs | forced | empty/long | guarded (answer) | evidence seen | "
            "misses (retrieval/reasoning/format/error) | placeholders filled |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        df1 = "-" if r["df1"] is None or r["agent"] == "rag" else f"{r['df1']:+.1f}{_interval(r['df1_ci'])}"
        recall = "-" if r["recall"] is None else f"{100 * r['recall']:.0f}%"
        misses = "/".join(str(r["failures"][k]) for k in FAILURE_CLASSES[:4])
        lines.append(f"| {r['agent']} | {r['em']:.1f} | {r['f1']:.1f} | {df1} | {r['sec']:.1f} | {r['calls']:.1f} | "
                     f"{r['tokens']:.0f} | {r['acted']} | {r['invented']} | {r['malformed']} | {r['repairs']} | "
                     f"{r['forced']} | {r['bad']} | {r['guarded']} ({r['answer_guard']}) | {recall} | {misses} | "
                     f"{r['fill']} |")
    shares = [r for r in rows if r["guards_share"]]
    if shares:  # each guards-off variant against its default: what those guards add
        lines += ["", "| guards off | their share: ΔF1 on - off [95% CI] | better / worse with them | re-asked "
                  "(the rest carried over) | calls/q, tokens/q they add |", "|---|---|---|---|---|"]
        for r in shares:
            g = r["guards_share"]
            lines.append(f"| {g['base']}: {g['off']} | {g['df1']:+.1f}{_interval(g['ci'])} | "
                         f"{g['better']} / {g['worse']} | {g['reasked']} | {g['calls']:+.2f}, {g['tokens']:+.0f} |")
    fired = sorted({name for r in rows for name in r["fired"]})
    if fired:  # questions each guard fired in, per variant
        lines += ["", "| agent | " + " | ".join(fired) + " |", "|---|" + "---|" * len(fired)]
        lines += [f"| {r['agent']} | " + " | ".join(str(r["fired"].get(n, 0)) for n in fired) + " |" for r in rows]
    return head + "\n".join(lines) + "\n"


def _interval(ci: tuple[float, float] | None) -> str:
    return f" [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else ""


# -- summary across environments -------------------------------------------------------------------
DESIGNS = ("opera", "mujica", "omne")  # the multi-hop designs; rag is their baseline, auto composes them
AUTO_KG_GAIN, AUTO_TEXT_GAIN, AUTO_SLACK = 10.0, 0.0, 1.0  # auto >= rag + 10 pooled over the KG environments,
# rag + 0 (no loss) over the text ones, each by its interval's lower bound, and >= the best single design - 1 on each
MAX_CALLS_RATIO, MAX_SECONDS_RATIO = 3.0, 3.0  # auto's calls and seconds a question against rag's, pooled by question
TEXT_GAIN, MAX_FORCED, MAX_ONE_SUBGOAL, MAX_PROTOCOL_SHARE = 5.0, 25.0, 20.0, 1.0  # percent


def variants(args: argparse.Namespace, env: str) -> dict[str, Path]:
    """The variants with a records file for `env` (bench/records.py), named as `--agents` names them; a file whose
    name is no variant is left out."""
    found = {}
    for variant, path in R.variants(args.llm, env, args.results).items():
        try:
            parse_variant(variant)
        except ValueError:
            continue
        found[variant] = path
    return found


def _fired(record: dict) -> set[str]:
    return set((record.get("health") or {}).get("guards") or {})


def default_records(agent: str, runs: dict[str, dict[str, dict]]) -> tuple[dict[str, dict], dict[str, int]]:
    """The agent's records with today's default guards, by id, and how many came from each other run. They are
    its default run's, except on a question where a guard outside today's default set fired (the run was made
    under an older default set): that record comes from a run of the agent with those guards off and no default
    one off, if there is one; else the question is left out."""
    stages = DESIGNS if agent == "auto" else (agent,)  # auto runs the designs' guards, each with its defaults
    on, records, taken = set().union(*(selected("auto", a) for a in stages)), {}, {}
    for qid, record in runs.get(agent, {}).items():
        extra = _fired(record) - on
        if not extra:
            records[qid] = record
            continue
        for variant, other in sorted(runs.items()):
            found = guards_off(variant)
            if (found and found[0] == agent and extra <= found[1] and not found[1] & on and qid in other
                    and not _fired(other[qid]) - on):
                records[qid], taken[variant] = other[qid], taken.get(variant, 0) + 1
                break
    return records, taken


def _cell(agent: str, env: str, asked: set[str], runs: dict[str, dict[str, dict]]) -> dict:
    """One agent on one environment, over the asked questions its default records answer (k of n)."""
    if agent in KG_ONLY and DEV_ENVIRONMENTS[env].kind != "kg":
        return {"agent": agent, "env": env, "k": 0, "n": len(asked), "applies": False}
    records, taken = default_records(agent, runs)
    recs = [records[i] for i in sorted(records)]
    return {"agent": agent, "env": env, "k": len(recs), "n": len(asked), "applies": True, "records": records,
            "taken": taken, "f1": 100 * _mean([r["f1"] for r in recs]), "sec": _mean([r["latency"] for r in recs]),
            "calls": _mean([r["llm_calls"] for r in recs]), "tokens": _mean([r["tokens"]["total"] for r in recs]),
            "prefilled": prefilled_per_question(recs),
            "malformed": sum(bool((r.get("health") or {}).get("malformed")) for r in recs),
            "llm_calls": sum(r["llm_calls"] for r in recs), "repairs": sum(format_repairs(r) for r in recs),
            "from_auto": sum(r.get("carried") == "auto" for r in recs)}


def summary_envs(args: argparse.Namespace, envs: list[str], agents: list[str]) -> dict[str, dict]:
    """Per environment: the asked ids, every variant's records of them ("runs"), and per agent a cell of its
    default records, their F1 and costs, and ΔF1 against rag with its paired-bootstrap interval where both
    answered every asked question ("cells")."""
    out = {}
    for env in envs:
        asked = asked_ids(args, env)
        runs = {v: {r["id"]: r | {"env": env} for r in R.load(path) if r["id"] in asked}
                for v, path in variants(args, env).items()}
        cells = {a: _cell(a, env, asked, runs) for a in agents}
        rag = cells.get("rag")
        for cell in cells.values():
            if rag and cell["agent"] != "rag" and cell["k"] == rag["k"] == len(asked) > 0:
                diffs = [cell["records"][i]["f1"] - rag["records"][i]["f1"] for i in sorted(asked)]
                clusters = [cluster_key(cell["records"][i]) for i in sorted(asked)]
                cell["df1"], cell["ci"] = 100 * _mean(diffs), paired_interval(diffs, clusters=clusters)
                cell["clusters"], cell["rag"] = len(set(clusters)), rag["records"]
        out[env] = {"asked": asked, "runs": runs, "cells": cells}
    return out


def _status(cell: dict) -> str | None:
    """"-" (the agent does not run there), "not run", "k of n", or None when every asked question is answered."""
    if not cell["applies"]:
        return "-"
    return "not run" if not cell["k"] else None if cell["k"] == cell["n"] else f"{cell['k']} of {cell['n']}"


def matrix_table(by_env: dict[str, dict], agents: list[str]) -> str:
    lines = ["| environment | questions (clusters) | " + " | ".join(agents) + " |", "|---|---|" + "---|" * len(agents)]
    notes = []
    for env, found in by_env.items():
        shown = []
        for cell in (found["cells"][a] for a in agents):
            text = _status(cell) or f"{cell['f1']:.1f}"
            shown.append(text + (f" ({cell['df1']:+.1f}{_interval(cell['ci'])})" if "df1" in cell else ""))
            notes += [f"- {cell['agent']} on {env}: {k} of {cell['n']} questions from `{v}` (a guard outside "
                      "today's default set fired on them in the default run)" for v, k in cell.get("taken", {}).items()]
            if cell.get("from_auto"):
                notes.append(f"- {cell['agent']} on {env}: {cell['from_auto']} of {cell['n']} questions from auto's "
                             f"{cell['agent']} stage (the same subgraph and settings; `from_auto`)")
        clusters = {cluster_key(r) for r in found["runs"].get("rag", {}).values()}
        lines.append(f"| {env} | {len(found['asked'])} ({len(clusters) if clusters else '-'}) | " + " | ".join(shown)
                     + " |")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def cost_table(by_env: dict[str, dict], agents: list[str]) -> str:
    lines = ["| environment | agent | questions | s/q | LLM calls/q | tokens/q | tokens prefilled/q |",
             "|---|---|---|---|---|---|---|"]
    cells = [found["cells"][a] for found in by_env.values() for a in agents if found["cells"][a]["k"]]
    for c in cells:
        prefilled = "-" if c["prefilled"] is None else f"{c['prefilled']:.0f}"
        lines.append(f"| {c['env']} | {c['agent']} | {_status(c) or c['n']} | {c['sec']:.1f} | {c['calls']:.1f} | "
                     f"{c['tokens']:.0f} | {prefilled} |")
    if any(c["prefilled"] is None for c in cells):
        lines += ["", "Tokens prefilled (prompt tokens not read from the prefix cache): \"-\" where the records do "
                  "not count the prompt tokens read from the cache (`tokens.cached`)."]
    return "\n".join(lines) + "\n"


def guards_table(by_env: dict[str, dict]) -> str | None:
    """Per guards-off variant, its share (guards on minus off) on each environment and pooled over their questions:
    an environment where its default run is complete and none of those guards fired counts as 0 on each question
    ("did not fire"); one without a complete pair of runs is left out of the pool."""
    keys = sorted({found for env in by_env.values() for v in env["runs"] if (found := guards_off(v))},
                  key=lambda k: (AGENTS.index(parse_variant(k[0])[0]), k[0], k[1] != _all_guards(k[0]), sorted(k[1])))
    if not keys:
        return None
    lines = ["| guards off | " + " | ".join(by_env) + " | pooled: share [95% CI], better / worse, questions | "
             "calls/q, tokens/q they add |", "|---|" + "---|" * (len(by_env) + 2)]
    for base, off in keys:
        shown, pairs = [], []
        for found in by_env.values():
            runs, ids = found["runs"], sorted(found["asked"])
            on = runs.get(base, {})
            variant = next((v for v in sorted(runs) if guards_off(v) == (base, off)), None)
            without = runs.get(variant, {})
            if len(on) < len(ids):
                shown.append(f"default run {len(on)} of {len(ids)}" if on else "not run")
            elif not variant and not off & set().union(*map(_fired, on.values())):
                shown.append("did not fire")
                pairs += [(on[i], on[i] | {"carried": base}) for i in ids]
            elif len(without) < len(ids):
                shown.append(f"{len(without)} of {len(ids)}" if without else "not run")
            else:
                share = _share([(on[i], without[i]) for i in ids])
                shown.append(f"{share['df1']:+.1f} ({share['better']}/{share['worse']}, {share['reasked']} re-asked)")
                pairs += [(on[i], without[i]) for i in ids]
        g = _share(pairs) if pairs else None
        pooled = (f"{g['df1']:+.1f}{_interval(g['ci'])}, {g['better']} / {g['worse']}, {g['n']} | "
                  f"{g['calls']:+.2f}, {g['tokens']:+.0f}") if g else "- | -"
        label = "all" if off == _all_guards(base) else ", ".join(sorted(off))
        lines.append(f"| {base}: {label} | " + " | ".join(shown) + f" | {pooled} |")
    return "\n".join(lines) + "\n"


def _gain_target(cells: list[dict], gain: float) -> tuple[str, str]:
    """Every cell ΔF1 >= gain: the verdict, and where each cell stands."""
    def said(c: dict) -> str:
        if "df1" not in c:
            return f"{c['agent']} on {c['env']} {_status(c) or 'without a complete rag run'}"
        return f"{c['agent']} on {c['env']} {c['df1']:+.1f} (by {abs(c['df1'] - gain):.1f})"

    met = [c for c in cells if c.get("df1", -math.inf) >= gain]
    missed = [c for c in cells if c.get("df1", math.inf) < gain]
    rest = [c for c in cells if "df1" not in c]
    verdict = "missed" if missed else "not measured" if rest or not cells else "met"
    parts = [f"met {len(met)} of {len(met) + len(missed)} measured" * bool(met or missed),
             "met: " * bool(met) + ", ".join(map(said, met)), "missed: " * bool(missed) + ", ".join(map(said, missed)),
             "not measured: " * bool(rest) + ", ".join(map(said, rest))]
    return verdict, "; ".join(p for p in parts if p)


def pooled(cells: list[dict]) -> dict | None:
    """ΔF1 against rag pooled over the questions of `cells` (each complete beside a complete rag), with the
    interval of a bootstrap over clusters (gold paths; questions elsewhere) within each environment."""
    done = [c for c in cells if "df1" in c]
    if not done or len(done) < len(cells):
        return None
    pairs = [(c["records"][i], c["rag"][i]) for c in done for i in sorted(c["records"])]
    diffs = [a["f1"] - b["f1"] for a, b in pairs]
    clusters = _clusters(pairs)
    ci, smallest = interval_and_detectable(diffs, clusters)
    return {"df1": 100 * _mean(diffs), "ci": ci, "n": len(diffs), "clusters": len(set(clusters)),
            "detectable": smallest}


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else "met" if ok else "missed"


def auto_rows(by_env: dict[str, dict]) -> list[tuple[str, str, str]]:
    """auto's targets: against the best single design per environment, against rag pooled by kind, its cost."""
    rows = []
    autos = {env: f["cells"]["auto"] for env, f in by_env.items() if "auto" in f["cells"]}
    stands, oks = [], []
    for env, cell in autos.items():
        designs = [c for a, c in by_env[env]["cells"].items() if a in DESIGNS and c["applies"] and c["k"] == c["n"]]
        if not cell["k"] or cell["k"] < cell["n"] or not designs:
            stands.append(f"{env}: {'auto ' + (_status(cell) or '') if cell['k'] < cell['n'] else 'no design run'}")
            oks.append(None)
            continue
        best = max(designs, key=lambda c: c["f1"])
        ok = cell["f1"] >= best["f1"] - AUTO_SLACK
        oks.append(ok)
        stands.append(f"{env}: {cell['f1']:.1f} vs {best['agent']} {best['f1']:.1f} ({cell['f1'] - best['f1']:+.1f})")
    verdict = False if False in oks else (True if oks and None not in oks else None)
    rows.append(("`auto` ≥ the best single design − 1 F1 on every environment", _verdict(verdict), "; ".join(stands)))
    for kind, gain in (("kg", AUTO_KG_GAIN), ("text", AUTO_TEXT_GAIN)):
        cells = [c for env, c in autos.items() if DEV_ENVIRONMENTS[env].kind == kind]
        p = pooled(cells) if cells else None
        said = "not measured" if p is None else (
            f"{p['df1']:+.1f}{_interval(p['ci'])} over {p['n']} questions in {p['clusters']} clusters; these "
            f"questions detect {p['detectable']:.1f} points" if p["detectable"] is not None else
            f"{p['df1']:+.1f} over {p['n']} questions")
        rows.append((f"`auto` ≥ `rag`{f' + {gain:g}' if gain else ''}, pooled over the "
                     f"{kind.upper() if kind == 'kg' else kind} "
                     "environments (by the interval's lower bound)",
                     "not measured" if p is None else by_interval(*(p["ci"] or (None, None)), gain) or "no interval",
                     said))
    ratios = []
    for env, cell in autos.items():
        rag = by_env[env]["cells"].get("rag")
        if cell["k"] and rag and rag["k"] and rag["calls"] and rag["sec"]:
            own = _rag_stage_seconds(cell)
            ratios.append((env, cell["calls"] / rag["calls"], cell["sec"] / (own or rag["sec"]), _escalated(cell),
                           own is not None))
    if ratios:
        calls, secs = pooled_cost(by_env, list(autos))
        ok = calls <= MAX_CALLS_RATIO and secs <= MAX_SECONDS_RATIO
        envs = f"{len(ratios)} environment" + "s" * (len(ratios) != 1)
        timed = sum(r[4] for r in ratios)
        against = ("its own `rag` stage's, timed in the same run" if timed == len(ratios) else
                   "`rag`'s run" if not timed else f"its own `rag` stage's in {timed}, `rag`'s run elsewhere")
        stands = (f"pooled by question over {envs}: {calls:.2f}× calls, {secs:.2f}× seconds (against {against}); " +
                  ", ".join(f"{e} {c:.2f}× / {t:.2f}×{why}" for e, c, t, why, _ in ratios))
        rows.append((f"`auto`: at most {MAX_CALLS_RATIO:g}× `rag`'s LLM calls and {MAX_SECONDS_RATIO:g}× its seconds",
                     _verdict(ok if len(ratios) == len(autos) else None), stands))
    return rows


def pooled_cost(by_env: dict[str, dict], envs: list[str]) -> tuple[float, float]:
    """auto's LLM calls and seconds against rag's, pooled by question over `envs` (each question weighs the same,
    not each environment): total calls over rag's on the same questions, and total seconds over its own `rag`
    stage's where every record timed it, else over `rag`'s run."""
    calls = rag_calls = secs = rag_secs = 0.0
    for env in envs:
        cell, rag = by_env[env]["cells"]["auto"], by_env[env]["cells"].get("rag")
        if not (rag and rag.get("records")):
            continue
        ids = sorted(set(cell["records"]) & set(rag["records"]))
        own = _rag_stage_seconds(cell)
        for i in ids:
            a, r = cell["records"][i], rag["records"][i]
            calls, rag_calls = calls + (a.get("llm_calls") or 0), rag_calls + (r.get("llm_calls") or 0)
            secs, rag_secs = secs + a["latency"], rag_secs + (_stage_seconds(a) if own is not None else r["latency"])
    return calls / max(rag_calls, 1.0), secs / max(rag_secs, 1e-9)


def _rag_stage_seconds(cell: dict) -> float | None:
    """The mean seconds of auto's own `rag` stage (the same subgraph and settings as `rag`), when every record
    says: the baseline of auto's seconds measured in the same run, on the same machine."""
    stages = [_stage_seconds(r) for r in cell["records"].values()]
    return _mean(stages) if stages and None not in stages else None


def _stage_seconds(record: dict) -> float | None:
    """The seconds of auto's own `rag` stage in one record, None where the record does not say."""
    return next((s["seconds"] for s in (record.get("route") or {}).get("stages") or [] if s.get("stage") == "rag"
                 and s.get("seconds") is not None), None)


def _escalated(cell: dict) -> str:
    """" (55 of 60 escalated, 5.9 calls each)": where auto's cost goes; "" when its records hold no route."""
    routes = [r for r in cell["records"].values() if (r.get("route") or {}).get("decisions")]
    if not routes:
        return ""
    up = [r for r in routes if _judged(r).get("action") == "escalate"]
    each = f", {_mean([r.get('llm_calls') or 0 for r in up]):.1f} calls each" if up else ""
    return f" ({len(up)} of {len(routes)} escalated{each})"


def share_row(by_env: dict[str, dict], agent: str, envs: tuple[str, ...], label: str, most: float,
              count: Any, kinds: Any = None) -> tuple[str, str, str] | None:
    """A target on the share of an agent's questions that `count(record)` holds (at most `most` percent); with
    `kinds(record)` (a list, None where a record does not say), those questions counted by kind."""
    cells = [f["cells"][agent] for env, f in by_env.items() if agent in f["cells"] and (not envs or env in envs)
             and f["cells"][agent]["k"]]
    if not cells:
        return None
    parts, ok = [], True
    for c in cells:
        held = [r for r in c["records"].values() if count(r)]
        ok &= 100 * len(held) <= most * c["k"]
        parts.append(f"{c['env']} {len(held)} of {c['k']}{_by_kind(held, kinds)}")
    return label, _verdict(ok), ", ".join(parts)


def _by_kind(records: list[dict], kinds: Any) -> str:
    """" (NoProgress 30, RoundCap 14)": the records counted by `kinds(record)`; "" when no record says."""
    said = [k for r in records if (k := kinds(r) if kinds else None) is not None]
    if not said:
        return ""
    counts = Counter(kind for k in said for kind in (k or ["none said"]))
    unsaid = len(records) - len(said)
    return " (" + ", ".join([f"{k} {n}" for k, n in sorted(counts.items())]
                            + ([f"not recorded {unsaid}"] if unsaid else [])) + ")"


def targets_table(by_env: dict[str, dict], agents: list[str]) -> str:
    """The targets of issue 42, met or missed and by how much."""
    rows = auto_rows(by_env) if "auto" in agents else []
    designs = [a for a in DESIGNS if a in agents]
    kg = [found["cells"][a] for env, found in by_env.items() for a in designs
          if DEV_ENVIRONMENTS[env].kind == "kg" and found["cells"][a]["k"]]
    if kg:
        rows.append(("every design ≥ `rag` on each KG environment", *_gain_target(kg, 0.0)))
    best = []  # per text environment, its best measured design
    for env, found in by_env.items():
        if DEV_ENVIRONMENTS[env].kind == "text":
            done = [found["cells"][a] for a in designs if "df1" in found["cells"][a]]
            best += [max(done, key=lambda c: c["df1"])] if done else []
    if best:
        rows.append((f"the best design ≥ `rag` + {TEXT_GAIN:.0f} on each text environment",
                     *_gain_target(best, TEXT_GAIN)))
    for row in (share_row(by_env, "mujica", (), f"Mujica: forced answers ≤ {MAX_FORCED:.0f}% of questions", MAX_FORCED,
                          lambda r: (r.get("health") or {}).get("forced"),
                          lambda r: (r.get("health") or {}).get("forced_by")),
                share_row(by_env, "opera", ("pq2h",), f"OPERA: one-sub-goal plans on two-hop PathQuestion ≤ "
                          f"{MAX_ONE_SUBGOAL:.0f}%", MAX_ONE_SUBGOAL, lambda r: r.get("plan_size") == 1,
                          lambda r: ["answered right" if (r.get("em") or 0) >= 1 else "answered wrong"])):
        if row:
            rows.append(row)
    runs = [c for found in by_env.values() for c in found["cells"].values() if c["k"]]
    ok = all(c["malformed"] == 0 and 100 * c["repairs"] <= MAX_PROTOCOL_SHARE * c["llm_calls"] for c in runs)
    per_agent = {a: [c for c in runs if c["agent"] == a] for a in agents}
    repairs = [f"{a} {sum(c['repairs'] for c in cs)} of {sum(c['llm_calls'] for c in cs)}"
               for a, cs in per_agent.items() if cs]
    stands = (f"malformed runs: {sum(c['malformed'] for c in runs)} of {sum(c['k'] for c in runs)} questions; "
              f"format-repair calls: {', '.join(repairs)}")
    worst = max(runs, key=lambda c: c["repairs"] / max(c["llm_calls"], 1), default=None)
    if worst:
        stands += (f"; the highest share in one run: {worst['agent']} on {worst['env']}, {worst['repairs']} of "
                   f"{worst['llm_calls']} ({100 * worst['repairs'] / max(worst['llm_calls'], 1):.1f}%)")
    rows.append((f"no malformed runs; repairs ≤ {MAX_PROTOCOL_SHARE:.0f}% of calls (each run)", _verdict(ok), stands))
    return "\n".join(["| target | verdict | where it stands |", "|---|---|---|"] +
                     [f"| {t} | **{v}** | {s} |" for t, v, s in rows]) + "\n"


def routes_table(by_env: dict[str, dict]) -> str | None:
    """`auto` and each of its variants per environment: questions that stopped at the first answer, escalated, and
    how each escalation ended; F1 of each group, and of the first answers where it escalated (records that score
    each decision's answer); the reasons, counted."""
    rows = []
    for env, found in by_env.items():
        for variant, by_id in found["runs"].items():
            if (variant != "auto" and not variant.startswith("auto:")) or not by_id:
                continue
            rows.append(_route_row(env, variant, list(by_id.values())))
    if not rows:
        return None
    return "\n".join(["| environment | agent | questions | stopped at rag (F1) | escalated (rag's F1 on them) | "
                      "the design answered (F1) | fell back to rag (F1) | why it escalated |",
                      "|---|---|---|---|---|---|---|---|", *rows]) + "\n"


def _judged(record: dict) -> dict:
    """auto's judgement of its first answer: the record's first decision that stops or escalates ({} if none)."""
    return next((d for d in (record.get("route") or {}).get("decisions") or []
                 if d.get("action") in ("stop", "escalate")), {})


def _route_row(env: str, variant: str, recs: list[dict]) -> str:
    decisions = [(r.get("route") or {}).get("decisions") or [] for r in recs]
    judged = [_judged(r) for r in recs]
    stopped = [r for r, j in zip(recs, judged) if j.get("action") == "stop"]
    escalated = [(r, d) for r, d, j in zip(recs, decisions, judged) if j.get("action") == "escalate"]
    took = [r for r, d in escalated if d[-1].get("action") == "answer"]
    agree = sum(1 for _, d in escalated if d[-1].get("reason") == "agrees with rag")
    back = [r for r, d in escalated if d[-1].get("action") == "fallback"]
    first = [d[0]["f1"] for _, d in escalated if "f1" in d[0]]
    reasons: dict[str, int] = {}
    for j in judged:
        if j.get("action") == "escalate":
            why = re.sub(r"one fact from .*", "one fact from the question's entity", str(j.get("reason")))
            reasons[why] = reasons.get(why, 0) + 1

    def f1(group: list[dict]) -> str:
        return f"{100 * _mean([r['f1'] for r in group]):.1f}" if group else "-"

    scored = f"{100 * _mean(first):.1f}" if escalated and len(first) == len(escalated) else "-"
    return (f"| {env} | `{variant}` | {len(recs)} | {len(stopped)} ({f1(stopped)}) | {len(escalated)} ({scored}) | "
            f"{len(took)} ({f1(took)}; {agree} agree with rag) | {len(back)} ({f1(back)}) | "
            + ", ".join(f"{k} {n}" for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])) + " |")


def mechanisms_table(args: argparse.Namespace, envs: list[str], pairs: list[tuple[str, str]]) -> str | None:
    """Each (before, after) pair of variants on the questions both answered, per environment: F1 and ΔF1 [95%
    interval over clusters], calls and seconds a question, the share of forced answers, and of plans of one
    sub-goal or sub-question in all; None without pairs."""
    rows = ["| before → after | environment | questions (clusters) | F1 | ΔF1 [95% CI] | LLM calls/q | s/q | "
            "forced answers | one-step plans |", "|---|---|---|---|---|---|---|---|---|"]
    for before, after in pairs:
        for env in envs:
            runs = [{r["id"]: r for r in R.load(R.path_of(args.llm, env, v, args.results))} for v in (before, after)]
            ids = sorted(asked_ids(args, env) & set(runs[0]) & set(runs[1]))
            if not ids:
                continue
            a, b = ([run[i] for i in ids] for run in runs)
            diffs = [y["f1"] - x["f1"] for x, y in zip(a, b)]
            clusters = [cluster_key(x) for x in a]

            def cell(key: Any, digits: int = 1, runs: tuple = (a, b)) -> str:
                return " → ".join(f"{_mean([key(r) for r in recs]):.{digits}f}" for recs in runs)

            forced = " → ".join(f"{sum(bool((r.get('health') or {}).get('forced')) for r in recs)} of {len(ids)}"
                                for recs in (a, b))
            one_step = " → ".join(f"{sum(r.get('plan_size') == 1 for r in recs)} of {len(ids)}"
                                  if any(r.get("plan_size") is not None for r in recs) else "-" for recs in (a, b))
            ci = _interval(paired_interval(diffs, clusters=clusters))
            rows.append(f"| `{before}` → `{after}` | {env} | {len(ids)} ({len(set(clusters))}) | "
                        f"{cell(lambda r: 100 * r['f1'])} | {100 * _mean(diffs):+.1f}{ci} | "
                        f"{cell(lambda r: r['llm_calls'], 2)} | {cell(lambda r: r['latency'])} | {forced} | "
                        f"{one_step} |")
    return "\n".join(rows) if len(rows) > 2 else None


def summary(args: argparse.Namespace, envs: list[str], agents: list[str]) -> str:
    """The tables that docs/benchmarks.md opens with, from the run folders of `args.out`; runs no model. With
    `--only-mechanisms`, the mechanisms table alone, without its heading (a slice on which only the pairs ran)."""
    if getattr(args, "only_mechanisms", False):
        return mechanisms_table(args, envs, _pairs(args)) or "no records of these pairs in this range"
    if getattr(args, "only_routes", False):
        return routes_table(summary_envs(args, envs, [])) or "no records of auto in this range"
    by_env = summary_envs(args, envs, agents)
    agents = [a for a in agents if a == "rag" or a in DESIGNS or any(f["cells"][a]["k"] for f in by_env.values())]
    text = [f"## Across environments: `{args.llm}`, {asked_range(args)}\n",
            "### Which agent where\n", "F1, and ΔF1 against `rag` on the same questions [95% interval of a paired "
            "bootstrap over clusters: questions that share a gold path are drawn together], with the default guards; "
            "a run that has not answered every question says how many it has.\n", matrix_table(by_env, agents)]
    for kind in ("kg", "text"):
        table = guards_table({e: f for e, f in by_env.items() if DEV_ENVIRONMENTS[e].kind == kind})
        if table:
            text += [f"### What the guards carry: {kind} environments\n", "Guards on minus off, per question; "
                     "re-asked: the questions asked again without them (the rest carried over).\n", table]
    routes = routes_table(by_env) if "auto" in agents else None
    if routes:
        text += ["### What `auto` did\n", "Per environment and variant: where it stopped at `rag` (its answer "
                 "supported by its evidence) and where it escalated to the design, with the F1 of each group and of "
                 "`rag`'s answers where it escalated.\n", routes]
    text += ["### Targets\n", targets_table(by_env, agents), "### Cost per question\n", cost_table(by_env, agents)]
    table = mechanisms_table(args, envs, _pairs(args))
    if table:
        text += ["### Mechanisms: each against the run without it\n", "Paired on the questions both runs "
                 "answered (a later slice may be in one run only); forced answers: questions whose design was told "
                 "to answer now (a cap, or a planner round that planned nothing to run); one-step plans: questions "
                 "whose whole plan was one sub-goal or sub-question.\n", table]
    return "\n".join(text)


def _pairs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The (before, after) variants of `--mechanism`."""
    return [tuple(pair) for pair in getattr(args, "mechanism", None) or []]


# docs/benchmarks.md: <!-- generated by: python bench/agents.py --summary ... --> the output <!-- end of generated -->
# (or bench/plans.py --report-only ...)
GENERATED = re.compile(r"(<!-- generated by: (python bench/(?:agents|plans|confidence)\.py [^>]*?) -->\n)"
                       r"((?:(?!<!-- generated by:).)*?)(\n?<!-- end of generated -->)", re.DOTALL)  # or empty
END = "\n<!-- end of generated -->"


def generated(command: str, results: Path = R.RESULTS_DIR, data: Path = DATA) -> str:
    """What `command` (a `bench/agents.py --summary ...`, `bench/plans.py --report-only ...` or `bench/confidence.py
    ...` line) prints, from the committed records."""
    import shlex

    script = shlex.split(command)[1]
    if script in ("bench/plans.py", "bench/confidence.py"):
        import confidence
        import plans

        tool = plans if script == "bench/plans.py" else confidence
        return tool.reports(tool.arguments().parse_args([*shlex.split(command)[2:], "--results", str(results),
                                                         "--data", str(data)]))
    args = arguments().parse_args(shlex.split(command)[2:])
    if not args.summary:
        raise ValueError(f"a generated block is a --summary: {command!r}")
    args.results, args.data = results, data
    return summary(args, args.env or list(DEV_ENVIRONMENTS), [a for a in split_agents(args.agents) if ":" not in a])


def write_doc(path: Path, results: Path = R.RESULTS_DIR, data: Path = DATA) -> int:
    """Regenerate every generated block of a markdown file in place; returns how many."""
    text = path.read_text(encoding="utf-8")
    blocks = GENERATED.findall(text)
    new = GENERATED.sub(lambda m: m[1] + generated(m[2], results, data).strip() + END, text)
    path.write_text(new, encoding="utf-8")
    return len(blocks)


PANELS = (("F1 (%)", "f1"), ("ΔF1 vs rag", "df1"), ("seconds per question", "sec"),
          ("LLM calls per question", "calls"), ("acted as designed (%)", "acted_pct"))


def plot(tables: dict[str, list[dict]], path: Path) -> None:
    """One row of panels per environment: F1 (EM as the hatched part of each bar), ΔF1 against rag,
    seconds and LLM calls per question, and the share of questions where the agent acted as designed."""
    envs = [e for e, rows in tables.items() if rows]
    if not envs:
        return
    fig, axes = pyplot().subplots(len(envs), len(PANELS), figsize=(3.6 * len(PANELS), 3 * len(envs)), squeeze=False)
    for row_axes, env in zip(axes, envs):
        rows = tables[env]
        names = [r["agent"] for r in rows]
        for ax, (label, key) in zip(row_axes, PANELS):
            ax.bar(names, [r[key] or 0.0 for r in rows], color="tab:blue")
            if key == "f1":
                ax.bar(names, [r["em"] for r in rows], color="tab:blue", alpha=0.6, hatch="//")
                ax.set_ylim(0, 100)
            if key == "df1":
                ax.axhline(0, color="black", linewidth=0.8)
            ax.set_title(f"{env} (n={rows[0]['n']}): {label}", fontsize=9)
            ax.tick_params(axis="x", rotation=30, labelsize=8)
    save_png(fig, path)


def arguments() -> argparse.ArgumentParser:
    """The command line of this script (`main`, and the commands of the generated blocks `generated` reads)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", action="append", choices=sorted(DEV_ENVIRONMENTS), help="repeatable; default: all")
    parser.add_argument("--agents", default=",".join(AGENTS), help="comma-separated")
    parser.add_argument("--llm", default="llamacpp:qwen2.5-coder-1.5b")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="4 questions on pq2h and hotpot")
    parser.add_argument("--jobs", type=int, default=2, help="evals at once (one model thread each)")
    parser.add_argument("--store", default=None, help="store URI (default: embedded store in OUT/store)")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--slice", choices=sorted(SLICES), default=None, help="ask each environment's slice "
                        "(SLICES) instead of --start/--limit: `validation` where defaults are chosen, `sealed` where "
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
    envs = args.env or list(DEV_ENVIRONMENTS)
    if args.quick:
        envs, args.limit = list(QUICK[0]), QUICK[1]
    args.store = args.store or f"embedded://{(args.out / 'store').resolve()}"
    agents = split_agents(args.agents)
    if args.slice:
        envs = [env for env in envs if env in SLICES[args.slice]]
        if args.slice == "sealed":
            args.results = args.results / "sealed"
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
