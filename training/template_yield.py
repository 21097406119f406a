"""The yield of Omne's template trajectories from their committed records (`mhqa templates --out DIR` writes
`counts.json` and `outcomes.jsonl.gz` there): per folder the questions tried, the templates made and why the others
were skipped, then the same by question type.

    python training/template_yield.py docs/runs/templates/*
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from mhqa_graph.training.omne_templates import MADE, OUTCOMES

from mhqa_graph.errors import InvalidInput
from mhqa_graph.eval.records import load


def _skipped(outcomes: Counter) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in outcomes.most_common() if reason != MADE) or "none"


def yield_table(folders: list[Path]) -> str:
    """The markdown tables of the template records in `folders`: one row per folder, then one per question type."""
    lines = ["| file (graph) | questions | templates | skipped |", "|---|---|---|---|"]
    by_type: list[str] = ["| file | question type | questions | templates |", "|---|---|---|---|"]
    for folder in folders:
        outcomes = load(folder / OUTCOMES)
        if not outcomes:
            raise InvalidInput(f"{folder} holds no {OUTCOMES}; `mhqa templates --out {folder}` writes it")
        counts = json.loads((folder / "counts.json").read_text(encoding="utf-8"))
        where = f"`{Path(counts['path']).name}`" + (f" from #{counts['start']}" if counts.get("start") else "")
        tally = Counter(o["outcome"] for o in outcomes)
        lines.append(f"| {where} ({counts['graph']}) | {len(outcomes):,} | {tally[MADE]:,} "
                     f"({100 * tally[MADE] / len(outcomes):.0f}%) | {_skipped(tally)} |")
        types = sorted({o["type"] for o in outcomes if o["type"]})
        for kind in types if len(types) > 1 else []:
            of_kind = [o for o in outcomes if o["type"] == kind]
            made = sum(o["outcome"] == MADE for o in of_kind)
            by_type.append(f"| {where} | {kind} | {len(of_kind):,} | {made:,} |")
    return "\n".join(lines + ([""] + by_type if len(by_type) > 2 else []))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", help="folders `mhqa templates --out` wrote")
    print(yield_table(parser.parse_args(argv).folders))


if __name__ == "__main__":
    main()
