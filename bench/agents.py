"""Every agent side by side on the same dev questions, with a real model: quality, cost and protocol health.

    python bench/agents.py --quick                       # 4 questions on PQ-2H and HotpotQA dev_b (~35 min, 2 cores)
    python bench/agents.py --env pq2h --env hotpot --limit 20 [--start 0] [--agents rag,omne]
                           [--llm llamacpp:qwen2.5-coder-1.5b] [--jobs 2] [--out bench/out]
    python bench/agents.py --start 100 --limit 40 --agents rag,rag:decoding=prompt,omne,omne:guards=none

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
resumes where it stopped and reuses finished questions. `--jobs` runs that many evals at once, each
with one llama.cpp thread. The tables compare agents on the questions of the asked range (`--start`,
`--limit`) that all of them answered:
EM, F1, ΔF1 against `rag` measured in the same run, seconds and LLM calls per question, protocol
health (the agent acted as designed, invented tool results, malformed runs, repairs, forced
answers, empty or over-long answers) and the failure classes of the misses (eval/diagnostics.py).
They go to stdout and `OUT/agents.md`; `OUT/agents.png` plots F1 and EM, ΔF1, seconds and calls per
question, and how often each agent acted as designed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mhqa_graph.graphs.guards import GUARDS, selected

from mhqa_graph.eval.diagnostics import FAILURE_CLASSES, failure_summary
from mhqa_graph.eval.environments import DEV_ENVIRONMENTS, open_environment
from mhqa_graph.eval.health import health_summary
from mhqa_graph.eval.report import RESULTS, read_records
from mhqa_graph.eval.runner import load_questions
from mhqa_graph.plots import pyplot, save_png

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
AGENTS = ("direct", "rag", "opera", "mujica", "omne")
KG_ONLY = {"omne"}  # agents that need a knowledge graph


QUICK = (("pq2h", "hotpot"), 4)


SETTINGS = {"decoding": "--decoding", "guards": "--guards", "guard_mode": "--guard-mode"}  # variant key -> eval flag


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    """`omne:guards=none;guard_mode=log` -> ("omne", {"guards": "none", "guard_mode": "log"})."""
    agent, _, rest = spec.partition(":")
    settings = dict(item.split("=", 1) for item in rest.split(";") if "=" in item)
    unknown = sorted(set(settings) - set(SETTINGS))
    if agent not in AGENTS or unknown or (rest and not settings):
        raise ValueError(f"bad agent {spec!r}: use <agent>[:key=value;...] with agent in {', '.join(AGENTS)} "
                         f"and keys in {', '.join(SETTINGS)}")
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


def eval_command(args: argparse.Namespace, env: str, variant: str) -> list[str]:
    spec = DEV_ENVIRONMENTS[env]
    agent, settings = parse_variant(variant)
    llm = args.llm if "?" in args.llm or not args.llm.startswith("llamacpp:") else f"{args.llm}?threads=1"
    mhqa = str(Path(sys.executable).with_name("mhqa"))
    flags = [f"{SETTINGS[key]}={value}" for key, value in settings.items()]  # "=": a value may start with "-"
    return [mhqa, "eval", str(args.data / spec.file), "--dataset", spec.dataset, "--agent", agent,
            "--llm", llm, "--store", args.store, "--limit", str(args.limit), "--start", str(args.start),
            "--concurrency", "1", *flags, "--out", str(run_dir(args.out, args.llm, env, variant))]


def guards_off(variant: str) -> tuple[str, frozenset[str]] | None:
    """(the variant this one differs from only in guards, the guards it turns off), if it only turns
    guards off; None otherwise (it turns none off, or logs instead of enforcing)."""
    agent, settings = parse_variant(variant)
    if "guards" not in settings or settings.get("guard_mode", "enforce") != "enforce":
        return None
    rest = {k: v for k, v in settings.items() if k != "guards"}
    turned_off = selected("auto", agent) - selected(settings["guards"], agent)
    off = frozenset(n for n in turned_off if agent in GUARDS[n].agents)
    if not off:
        return None
    return agent + (":" + ";".join(f"{k}={v}" for k, v in rest.items()) if rest else ""), off


def carry_over(args: argparse.Namespace, env: str, variant: str) -> int:
    """Copy into `variant`'s run folder the records of its default run (see `guards_off`) on which none of
    the guards it turns off fired, for the asked questions it has not answered; returns how many."""
    found = guards_off(variant)
    if not found:
        return 0
    base, off = found
    folder = run_dir(args.out, args.llm, env, variant)
    wanted = asked_ids(args, env) - {r["id"] for r in read_records(folder / RESULTS)}
    rows = [r for r in read_records(run_dir(args.out, args.llm, env, base) / RESULTS)
            if r["id"] in wanted and not r.get("error") and not off & set((r.get("health") or {}).get("guards") or {})]
    if rows:
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / RESULTS).open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r | {"carried": base}, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)


def fired_guards(args: argparse.Namespace, env: str, variant: str) -> list[str]:
    """The guards that fired in `variant`'s run on the asked questions, most frequent first."""
    wanted = asked_ids(args, env)
    counts: dict[str, int] = {}
    for r in read_records(run_dir(args.out, args.llm, env, variant) / RESULTS):
        if r["id"] in wanted:
            for name in (r.get("health") or {}).get("guards") or {}:
                counts[name] = counts.get(name, 0) + 1
    return sorted(counts, key=lambda n: (-counts[n], n))


def run_all(args: argparse.Namespace, jobs: list[tuple[str, str]]) -> None:
    """The evals of `jobs`, `args.jobs` at a time; each one's output goes to its run folder's eval.log.
    The environments are built first, so that the evals open the shared store read-only side by side.
    Variants that turn guards off run after the others, on what `carry_over` leaves them."""
    for env in dict.fromkeys(env for env, _ in jobs):
        spec = DEV_ENVIRONMENTS[env]
        with open_environment(args.store, spec.dataset, args.data / spec.file) as (_, built):
            print(f"  environment {env}: {'ingested' if built['ingested'] else 'ready'}", file=sys.stderr)

    def run(job: tuple[str, str]) -> None:
        carried = carry_over(args, *job)
        if carried:
            print(f"  {job[0]}/{job[1]}: {carried} questions carried over", file=sys.stderr, flush=True)
        _run(eval_command(args, *job), run_dir(args.out, args.llm, *job))

    for phase in ([j for j in jobs if not guards_off(j[1])], [j for j in jobs if guards_off(j[1])]):
        with ThreadPoolExecutor(args.jobs) as pool:
            for _ in pool.map(run, phase):
                pass


def _run(cmd: list[str], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with (folder / "eval.log").open("a", encoding="utf-8") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "160"})
    print(f"  {folder.parent.name}/{folder.name}: exit {code} after {time.perf_counter() - started:.0f}s",
          file=sys.stderr, flush=True)


# -- tables ----------------------------------------------------------------------------------
def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def paired_interval(diffs: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """The 95% paired-bootstrap interval of the mean of per-question differences, in F1 points."""
    if len(diffs) < 2:
        return None
    rng = random.Random(seed)
    means = sorted(_mean(rng.choices(diffs, k=len(diffs))) for _ in range(resamples))
    return 100 * means[int(0.025 * resamples)], 100 * means[int(0.975 * resamples) - 1]


def asked_ids(args: argparse.Namespace, env: str) -> set[str]:
    """The ids of questions `args.start` .. `args.start + args.limit - 1` of the environment's file."""
    spec = DEV_ENVIRONMENTS[env]
    return {q.id for q in load_questions(spec.dataset, args.data / spec.file, limit=args.limit, start=args.start)}


def env_rows(args: argparse.Namespace, env: str, agents: list[str]) -> tuple[int, list[dict]]:
    """(questions of the asked range that all agents' runs answered, one row of metrics per agent over
    those questions). A run folder may hold more questions, from earlier runs over other ranges."""
    records = {a: {r["id"]: r for r in read_records(run_dir(args.out, args.llm, env, a) / RESULTS)} for a in agents}
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
                [by_id[i]["f1"] - records["rag"][i]["f1"] for i in sorted(shared)]),
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
    diffs = [records[found[0]][i]["f1"] - by_id[i]["f1"] for i in ids]
    return {"off": ", ".join(sorted(found[1])), "base": found[0], "df1": 100 * _mean(diffs),
            "ci": paired_interval(diffs), "better": sum(d > 0 for d in diffs), "worse": sum(d < 0 for d in diffs),
            "reasked": sum(1 for i in ids if not by_id[i].get("carried")),
            "calls": _mean([records[found[0]][i]["llm_calls"] - by_id[i]["llm_calls"] for i in ids]),
            "tokens": _mean([records[found[0]][i]["tokens"]["total"] - by_id[i]["tokens"]["total"] for i in ids])}


def _fill(records: list[dict]) -> str:
    """OPERA's placeholders resolved / written over the records ("-" for other agents)."""
    counts = [(r.get("trace") or {}).get("design", {}).get("placeholders") for r in records]
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
        df1 = "-" if r["df1"] is None or r["agent"] == "rag" else f"{r['df1']:+.1f}"
        if r["df1_ci"] and r["agent"] != "rag":
            df1 += f" [{r['df1_ci'][0]:+.1f}, {r['df1_ci'][1]:+.1f}]"
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
            ci = f" [{g['ci'][0]:+.1f}, {g['ci'][1]:+.1f}]" if g["ci"] else ""
            lines.append(f"| {g['base']}: {g['off']} | {g['df1']:+.1f}{ci} | {g['better']} / {g['worse']} | "
                         f"{g['reasked']} | {g['calls']:+.2f}, {g['tokens']:+.0f} |")
    fired = sorted({name for r in rows for name in r["fired"]})
    if fired:  # questions each guard fired in, per variant
        lines += ["", "| agent | " + " | ".join(fired) + " |", "|---|" + "---|" * len(fired)]
        lines += [f"| {r['agent']} | " + " | ".join(str(r["fired"].get(n, 0)) for n in fired) + " |" for r in rows]
    return head + "\n".join(lines) + "\n"


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


def main() -> None:
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
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out")
    parser.add_argument("--report-only", action="store_true", help="tables from finished runs, run nothing")
    parser.add_argument("--guards", default=None, help="also run every agent with these guards (e.g. none), "
                        "or 'each': every guard that fired, alone off")
    args = parser.parse_args()
    envs = args.env or list(DEV_ENVIRONMENTS)
    if args.quick:
        envs, args.limit = list(QUICK[0]), QUICK[1]
    args.store = args.store or f"embedded://{(args.out / 'store').resolve()}"
    agents = split_agents(args.agents)
    if args.guards and args.guards != "each":
        agents += [f"{a}:guards={args.guards}" for a in agents if ":" not in a and a not in ("rag", "direct")]
    try:
        kinds = {a: parse_variant(a)[0] for a in agents}
    except ValueError as exc:
        parser.error(str(exc))
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
    last = args.start + args.limit - 1
    tables, text = {}, [f"## Agents side by side: `{args.llm}`, questions {args.start}..{last}\n"]
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
    main()
