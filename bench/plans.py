"""The Plan agent alone, with a real model: how many sub-goals OPERA plans for each question of a dev slice, as it
plans by default, with worked plans (`plan_examples`) and with sub-goals written as relations (`ask_as=relation`),
against the gold number of hops. One model call a question, so a slice of
60 takes minutes where a whole OPERA run takes an hour.

    python bench/plans.py --env pq2h --start 140 --limit 60                  # ask what the records lack, then report
    python bench/plans.py --env pq2h --start 140 --limit 60 --report-only

Records (id, cluster, hops, sub-goals) go to bench/results/<llm>/<env>/opera-plan[:settings].jsonl.gz; the report
gives, per variant, the share of plans shorter than the gold chain (one sub-goal for a two-hop question) and the
difference against the first variant with its 95% interval over clusters (PathQuestion's paraphrases); a variant
without records on an environment is left out of its table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

from mhqa_graph.graphs import make_context, parse_settings
from mhqa_graph.graphs.opera.graph import plan

from mhqa_graph.eval.diagnostics import chain_json
from mhqa_graph.eval.environments import DEV_ENVIRONMENTS, ensure_worked_plans, open_environment
from mhqa_graph.eval.paired import cluster_key, paired_interval
from mhqa_graph.eval.runner import load_questions

sys.path.insert(0, str(Path(__file__).resolve().parent))
import records as R  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
VARIANTS = ("opera-plan", "opera-plan:plan_examples=plans", "opera-plan:ask_as=relation")


def settings_of(variant: str) -> dict:
    _, _, rest = variant.partition(":")
    return parse_settings("opera", [s for s in rest.split(";") if s])


def ask(args: argparse.Namespace, env: str, variant: str) -> None:
    """Plan each question of the slice the variant's records lack; records saved after each question."""
    spec = DEV_ENVIRONMENTS[env]
    path = R.path_of(args.llm, env, variant, args.results)
    have = {r["id"]: r for r in R.load(path)}
    items = [q for q in load_questions(spec.dataset, args.data / spec.file, args.limit, args.start) if q.id not in have]
    if not items:
        return
    with open_environment(args.store, spec.dataset, args.data / spec.file) as (store, built):
        ensure_worked_plans(store, args.data)
        llm = args.llm if "?" in args.llm or not args.llm.startswith("llamacpp:") else f"{args.llm}?threads=1"
        ctx = make_context("opera", llm=llm, store=store, corpus=built["corpus"], graph=built["graph"],
                           **settings_of(variant))
        for n, item in enumerate(items, 1):
            out = plan({"question": item.question, "topic_entities": list(item.topic_entities)},
                       SimpleNamespace(context=ctx))
            notes = list(getattr(out.get("notes"), "value", out.get("notes")) or [])
            have[item.id] = {"id": item.id, "cluster": cluster_key({"id": item.id, "chain": chain_json(item.chain)}),
                             "hops": item.hops, "subgoals": out["plan"], "notes": notes,
                             **({"error": notes[-1] if notes else "halted"} if out.get("halted") else {})}
            R.write(path, have.values())
            print(f"  {env} {variant} {n}/{len(items)}: {len(out['plan'])} sub-goals", file=sys.stderr, flush=True)


def report(args: argparse.Namespace, env: str) -> str:
    spec = DEV_ENVIRONMENTS[env]
    wanted = [q.id for q in load_questions(spec.dataset, args.data / spec.file, args.limit, args.start)]
    runs = {v: {r["id"]: r for r in R.load(R.path_of(args.llm, env, v, args.results))} for v in args.variants}
    runs = {v: recs for v, recs in runs.items() if recs} or runs  # a variant not run on this environment: left out
    # a plan that halted (its model call failed) has no length: left out
    ids = [i for i in wanted if all(i in recs and not recs[i].get("error") for recs in runs.values())]
    lines = [f"{env}, questions {args.start}-{args.start + args.limit - 1} ({len(ids)} planned by every variant, "
             f"{len({next(iter(runs.values()))[i]['cluster'] for i in ids})} clusters)\n",
             "| variant | shorter than the gold chain | one sub-goal | mean sub-goals | Δ shorter [95% CI] |",
             "|---|---|---|---|---|"]
    base = next(iter(runs))

    def short(r: dict) -> float:
        return float(bool(r["hops"]) and len(r["subgoals"]) < r["hops"])

    for v, recs in runs.items():
        rows = [recs[i] for i in ids]
        if not rows:
            continue
        share = sum(map(short, rows)) / len(rows)
        diffs = [short(recs[i]) - short(runs[base][i]) for i in ids]
        ci = paired_interval(diffs, clusters=[recs[i]["cluster"] for i in ids]) if v != base else None
        delta = f"{100 * sum(diffs) / len(diffs):+.1f} [{ci[0]:+.1f}, {ci[1]:+.1f}] points" if ci else "–"
        lines.append(f"| {v} | {100 * share:.0f}% | {sum(len(r['subgoals']) == 1 for r in rows)} of {len(rows)} | "
                     f"{sum(len(r['subgoals']) for r in rows) / len(rows):.2f} | {delta} |")
    return "\n".join(lines)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", action="append", choices=sorted(DEV_ENVIRONMENTS), help="repeatable; default pq2h")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: opera-plan[:key=value;...]")
    parser.add_argument("--llm", default="llamacpp:qwen2.5-coder-1.5b")
    parser.add_argument("--start", type=int, default=140)
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--store", default=f"embedded://{Path(__file__).resolve().parent / 'out' / 'store'}")
    parser.add_argument("--results", type=Path, default=R.RESULTS_DIR)
    parser.add_argument("--report-only", action="store_true")
    return parser


def reports(args: argparse.Namespace) -> str:
    """The report of each environment of `args`, from the records (runs no model)."""
    args.variants = [v for v in args.variants.split(",") if v] if isinstance(args.variants, str) else args.variants
    return "\n\n".join(report(args, env) for env in args.env or ["pq2h"])


def main() -> None:
    args = arguments().parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    if not args.report_only:
        for env in args.env or ["pq2h"]:
            for variant in args.variants:
                ask(args, env, variant)
    print(reports(args))


if __name__ == "__main__":
    main()
