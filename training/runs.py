"""The dev table of a learning run from its committed records (`DevConfig.records`, e.g. `docs/runs/<run>/`): each
dev run's F1, EM and LLM calls, and each run against the one before it and against the untrained policy, paired
by question, with a 95% bootstrap interval over clusters (PathQuestion's gold paths, else questions).

    python training/runs.py docs/runs/<run>                 # every dev run, in the order the log wrote them
    python training/runs.py docs/runs/<run> --pair warmup iter1 --pair untrained final_guards_none
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mhqa_graph.training.dev import UNTRAINED
from mhqa_graph.training.logs import LOG

from mhqa_graph.errors import InvalidInput
from mhqa_graph.eval.paired import cluster_key, paired_comparison
from mhqa_graph.eval.records import SUFFIX, load, natural


def dev_runs(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """name -> records of the dev runs committed in `folder`: the untrained one first, then in the order the
    log names them, then the others by name (iter2 before iter10)."""
    files = {p.name[:-len(SUFFIX)]: p for p in sorted(folder.glob("*" + SUFFIX))}
    if not files:
        raise InvalidInput(f"{folder} holds no dev records (*{SUFFIX}); a run writes them with dev.records")
    logged = []
    if (log := folder / LOG).is_file():
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:  # a line cut short by a stopped run
                continue
            name = entry.get("after") if entry.get("event") == "dev" else (
                f"iter{entry['iteration']}" if "iteration" in entry and "dev_f1" in entry else None)
            if name in files and name not in logged:
                logged.append(name)
    order = [UNTRAINED] * (UNTRAINED in files) + [n for n in logged if n != UNTRAINED]
    order += sorted((n for n in files if n not in order), key=natural)
    return {name: load(files[name]) for name in order}


def _delta(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    c = paired_comparison(before, after)
    if c["df1_low"] is None:
        return f"{c['df1']:+.1f} ({c['paired']} q)"
    return (f"{c['df1']:+.1f} [{c['df1_low']:+.1f}, {c['df1_high']:+.1f}] ({c['paired']} q, {c['clusters']} clusters; "
            f"{c['better']} better, {c['worse']} worse)")


def table(runs: dict[str, list[dict[str, Any]]], pairs: list[tuple[str, str]]) -> str:
    """The markdown table of `runs`, then one line per pair asked for."""
    def mean(rows: list[dict[str, Any]], key: str) -> float:
        return sum(r.get(key) or 0 for r in rows) / max(1, len(rows))

    names = list(runs)
    lines = ["| dev run | questions (clusters) | F1 | EM | LLM calls/q | ΔF1 vs the run before | ΔF1 vs untrained |",
             "|---|---|---|---|---|---|---|"]
    for i, name in enumerate(names):
        rows = runs[name]
        before = _delta(runs[names[i - 1]], rows) if i else ""
        untrained = _delta(runs[UNTRAINED], rows) if UNTRAINED in runs and name != UNTRAINED else ""
        lines.append(f"| {name} | {len(rows)} ({len({cluster_key(r) for r in rows})}) | {100 * mean(rows, 'f1'):.1f} | "
                     f"{100 * mean(rows, 'em'):.1f} | {mean(rows, 'llm_calls'):.2f} | {before} | {untrained} |")
    for a, b in pairs:
        missing = [n for n in (a, b) if n not in runs]
        if missing:
            raise InvalidInput(f"no dev run {', '.join(missing)}; the records hold {', '.join(names)}")
        lines.append(f"\n`{a}` → `{b}`: ΔF1 {_delta(runs[a], runs[b])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a learning run's committed records (DevConfig.records)")
    parser.add_argument("--pair", nargs=2, action="append", default=[], metavar=("BEFORE", "AFTER"),
                        help="also compare these two dev runs (e.g. a warm start and the iteration after it)")
    args = parser.parse_args(argv)
    print(table(dev_runs(args.folder), [tuple(p) for p in args.pair]))


if __name__ == "__main__":
    main()
