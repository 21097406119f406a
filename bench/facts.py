"""Where the gold first hop's fact lands among a Mujica worker's graph contexts, with no model: the worker's
retrieval (`graphs/mujica/graph.retrieve`) for each question of a dev slice, the question itself as the query, in the
matched entities' turn order and with `rank_facts` (the asked relation's facts first). It is how `rank_facts`
was found (PQ-2H 0-99); the model's answers with it are measured by `bench/agents.py`.

    python bench/facts.py --env pq2h --env pq3h --start 0 --limit 100      # under a minute an environment

A fact counts as found at position p when its subject, relation and object are all in the p-th context line."""

from __future__ import annotations

import argparse
from pathlib import Path

from mhqa_graph.graphs import make_context
from mhqa_graph.graphs.mujica.graph import retrieve

from mhqa_graph.eval.environments import DEV_ENVIRONMENTS, open_environment
from mhqa_graph.eval.runner import load_questions

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
KG_ENVS = tuple(name for name, spec in DEV_ENVIRONMENTS.items() if spec.kind == "kg")


def position(lines: list[str], triple: tuple[str, str, str]) -> int | None:
    """The 0-based position of the first context line holding the triple's three parts (case folded), or None."""
    parts = [p.lower() for p in triple]
    return next((i for i, line in enumerate(lines) if all(p in line.lower() for p in parts)), None)


def probe(args: argparse.Namespace, env: str) -> str:
    """One markdown table row per ordering of the environment's slice."""
    spec = DEV_ENVIRONMENTS[env]
    items = [q for q in load_questions(spec.dataset, args.data / spec.file, args.limit, args.start)
             if q.chain and q.chain[0].triples]
    rows = []
    with open_environment(args.store, spec.dataset, args.data / spec.file) as (store, built):
        for rank in (False, True):
            ctx = make_context("mujica", store=store, graph=built["graph"], rank_facts=rank)
            found = [position([c.id for c in retrieve(ctx, q.question)[1]], q.chain[0].triples[0]) for q in items]
            at = [p for p in found if p is not None]
            rows.append(f"| {env} | {'ranked (`rank_facts`)' if rank else 'turn order'} | {len(items)} | "
                        f"{len(at)} | {sum(p == 0 for p in at)} | {sum(p < 3 for p in at)} | "
                        f"{sum(at) / len(at) + 1 if at else 0:.2f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", action="append", choices=KG_ENVS, help="repeatable; default: the KG environments")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--store", default=f"embedded://{Path(__file__).resolve().parent / 'out' / 'store'}",
                        help="the store bench/agents.py builds (default: bench/out/store)")
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    print(f"Questions {args.start}..{args.start + args.limit - 1}: the gold first hop's fact among the worker's "
          "contexts (the question as the query)\n")
    print("| environment | order | questions | found | first | in the first 3 | mean position |")
    print("|---|---|---|---|---|---|---|")
    for env in args.env or KG_ENVS:
        print(probe(args, env))


if __name__ == "__main__":
    main()
