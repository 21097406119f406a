"""The dev table of a learning run from its committed records (`DevConfig.records`, e.g. `docs/runs/<run>/`): each
dev run's F1, EM and LLM calls, and each run against the one before it and against the untrained policy, paired
by question, with a 95% bootstrap interval over clusters (PathQuestion's gold paths, else questions).

    python training/runs.py docs/runs/<run>                 # every dev run, in the order the log wrote them
    python training/runs.py docs/runs/<run> --pair iter0 iter1 --pair untrained final_guards_none

With the guards-off runs (`dev.guards_off`) it also prints the 2x2: untrained/trained x guards on/off; with a
teacher's committed rollouts (MyGO's warm-up, Omne's SFT data), what each sample holds; with `--steps`, the per-step
rewards of the trainer's log.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from mhqa_graph.training.dev import GUARDS_NONE, GUARDS_OFF, UNTRAINED, UNTRAINED_GUARDS_OFF
from mhqa_graph.training.logs import LOG, read_log
from mhqa_graph.training.rollouts import MADE_WITH

from mhqa_graph.errors import InvalidInput
from mhqa_graph.eval.health import behaviour
from mhqa_graph.eval.paired import cluster_key, paired_comparison
from mhqa_graph.eval.records import SUFFIX, load, natural


def mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(r.get(key) or 0 for r in rows) / max(1, len(rows))


def dev_runs(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """name -> records of the dev runs committed in `folder`: the untrained one first, then in the order the
    log names them, then the others by name (iter2 before iter10)."""
    files = {p.name[:-len(SUFFIX)]: p for p in sorted(folder.glob("*" + SUFFIX))}
    if not files:
        raise InvalidInput(f"{folder} holds no dev records (*{SUFFIX}); a run writes them with dev.records")
    logged = []
    for entry in read_log(folder / LOG):
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


def table(runs: dict[str, list[dict[str, Any]]], pairs: list[tuple[str, str]],
          others: dict[str, list[dict[str, Any]]] | None = None) -> str:
    """The markdown table of `runs`, then one line per pair asked for, whose runs may also be `others` (other
    runs' dev runs, named `<run>/<name>`)."""
    names = list(runs)
    lines = ["| dev run | questions (clusters) | F1 | EM | LLM calls/q | ΔF1 vs the run before | ΔF1 vs untrained |",
             "|---|---|---|---|---|---|---|"]
    for i, name in enumerate(names):
        rows = runs[name]
        before = _delta(runs[names[i - 1]], rows) if i else ""
        untrained = _delta(runs[UNTRAINED], rows) if UNTRAINED in runs and name != UNTRAINED else ""
        lines.append(f"| {name} | {len(rows)} ({len({cluster_key(r) for r in rows})}) | {100 * mean(rows, 'f1'):.1f} | "
                     f"{100 * mean(rows, 'em'):.1f} | {mean(rows, 'llm_calls'):.2f} | {before} | {untrained} |")
    known = runs | (others or {})
    for a, b in pairs:
        missing = [n for n in (a, b) if n not in known]
        if missing:
            raise InvalidInput(f"no dev run {', '.join(missing)}; the records hold {', '.join(names)}")
        lines.append(f"\n`{a}` → `{b}`: ΔF1 {_delta(known[a], known[b])}")
    return "\n".join(lines)


def two_by_two(runs: dict[str, list[dict[str, Any]]]) -> str:
    """The 2x2 of the papers' claim (does training teach what the guards patch?): F1 of the untrained and the
    last trained policy, each with guards on and "none", and the paired differences; "" unless all four ran."""
    trained = [n for n in runs if n != UNTRAINED and n not in GUARDS_NONE]
    if not trained or any(n not in runs for n in (UNTRAINED, *GUARDS_NONE)):
        return ""
    last = trained[-1]

    def f1(name: str) -> str:
        return f"{100 * mean(runs[name], 'f1'):.1f}"

    return "\n".join([
        "| F1 | guards on | guards none |", "|---|---|---|",
        f"| untrained | {f1(UNTRAINED)} | {f1(UNTRAINED_GUARDS_OFF)} |",
        f"| trained (`{last}`) | {f1(last)} | {f1(GUARDS_OFF)} |", "",
        f"training, guards on: ΔF1 {_delta(runs[UNTRAINED], runs[last])}",
        f"training, guards none: ΔF1 {_delta(runs[UNTRAINED_GUARDS_OFF], runs[GUARDS_OFF])}",
        f"the guards, untrained: ΔF1 {_delta(runs[UNTRAINED_GUARDS_OFF], runs[UNTRAINED])}",
        f"the guards, trained: ΔF1 {_delta(runs[GUARDS_OFF], runs[last])}",
        f"trained without guards against untrained with them: ΔF1 {_delta(runs[UNTRAINED], runs[GUARDS_OFF])}"])


STEP_COLUMNS = (("reward", "training reward"), ("reward_std", "its std"), ("eval_reward", "held-back reward"),
                ("loss", "loss"), ("grad_norm", "grad norm"))


def steps(folder: Path) -> str:
    """The per-step table of the trainer's log (TRL's log lines: reward, its std, the held-back reward, loss, grad
    norm), by stage or role; "" without a log or steps."""
    rows = []
    for entry in read_log(folder / LOG):
        if "step" in entry and any(key in entry for key, _ in STEP_COLUMNS):
            part = entry.get("role", entry.get("stage", entry.get("phase", "")))
            cells = [f"{entry[key]:.3f}" if isinstance(entry.get(key), (int, float)) else "" for key, _ in STEP_COLUMNS]
            rows.append(f"| {part} | {entry['step']} | " + " | ".join(cells) + " |")
    if not rows:
        return ""
    head = "| stage | step | " + " | ".join(title for _, title in STEP_COLUMNS) + " |"
    return "\n".join([head, "|" + "---|" * (2 + len(STEP_COLUMNS)), *rows])


ITERATION_COLUMNS = (("tau", "τ"), ("mean_reward", "mean reward"), ("trajectories", "trajectories"),
                     ("with_workers", "with workers"), ("kept", "kept"), ("sft_rows", "SFT chats"),
                     ("warmup_rows", "WarmUp chats"), ("loss", "loss"), ("failures", "failed"),
                     ("rollout_s", "rollouts s"), ("sft_s", "SFT s"))


def iterations(folder: Path) -> str:
    """MyGO's iteration lines of the trainer's log (τ, the batch's mean reward, what was kept and trained on, the
    loss, the times), the WarmUp as iteration 0; "" without any."""
    rows = []
    for entry in read_log(folder / LOG):
        if "iteration" in entry:
            cells = [("" if (v := entry.get(key)) is None else f"{v:.0f}" if key.endswith("_s")
                      else f"{v:.3f}" if isinstance(v, float) else str(v)) for key, _ in ITERATION_COLUMNS]
            rows.append(f"| {entry['iteration']} | " + " | ".join(cells) + " |")
    if not rows:
        return ""
    head = "| iteration | " + " | ".join(title for _, title in ITERATION_COLUMNS) + " |"
    return "\n".join([head, "|" + "---|" * (1 + len(ITERATION_COLUMNS)), *rows])


def teacher_samples(folder: Path) -> str:
    """A teacher's committed rollouts (`training/rollouts.publish_rollouts`), a row per sample: questions, answers
    with EM 1 (what MyGO's warm-up keeps), mean F1 and LLM calls; "" without any."""
    rows = []
    for made_with in sorted(folder.glob(f"*_rollouts/*/{MADE_WITH}")):
        teacher = json.loads(made_with.read_text(encoding="utf-8"))
        for file in sorted(made_with.parent.glob(f"sample*{SUFFIX}"), key=lambda f: natural(f.name)):
            records, sample = load(file), file.name.removesuffix(SUFFIX)
            exact = sum(r.get("em") == 1 for r in records)
            rows.append(f"| {teacher.get('teacher')} | {teacher.get('temperature')} | {sample} | {len(records)} | "
                        f"{exact} | {100 * mean(records, 'f1'):.1f} | {mean(records, 'llm_calls'):.2f} |")
    if not rows:
        return ""
    head = "| teacher | temperature | sample | questions | EM 1 | F1 | LLM calls/q |\n|---|---|---|---|---|---|---|"
    return "\n".join([head, *rows])


def answers(runs: dict[str, list[dict[str, Any]]]) -> str:
    """How each dev run's answers came about: questions whose planner was forced to answer (and why), answers
    that say there is none, questions on which a guard fired (`eval.health.behaviour`)."""
    lines = ["| dev run | forced to answer | forced by | no answer (\"unknown\") | a guard fired |",
             "|---|---|---|---|---|"]
    for name, rows in runs.items():
        health, rates = [r.get("health") or {} for r in rows], behaviour(rows)
        why = Counter(reason for h in health for reason in set(h.get("forced_by") or ()))
        lines.append(f"| {name} | {sum(bool(h.get('forced')) for h in health)} of {len(rows)} | "
                     f"{', '.join(f'{k} {v}' for k, v in why.most_common())} | {rates['unknown']} | "
                     f"{rates['guarded']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a learning run's committed records (DevConfig.records)")
    parser.add_argument("--pair", nargs=2, action="append", default=[], metavar=("BEFORE", "AFTER"),
                        help="also compare these two dev runs (e.g. a warm start and the iteration after it); "
                             "<run>/<name> names another run's, in the folder beside this one (e.g. a control's)")
    parser.add_argument("--steps", action="store_true", help="also the per-step table of the trainer's log")
    parser.add_argument("--answers", action="store_true",
                        help="also how the answers came about: forced (and why), \"unknown\", a guard fired")
    args = parser.parse_args(argv)
    runs = dev_runs(args.folder)
    pairs = [tuple(p) for p in args.pair]
    others = {name: load(args.folder.parent / (name + SUFFIX)) for pair in pairs for name in pair
              if "/" in name and name not in runs}  # another run's dev run, e.g. a control's
    if missing := [name for name, rows in others.items() if not rows]:
        raise InvalidInput(f"no records {', '.join(str(args.folder.parent / (n + SUFFIX)) for n in missing)}")
    print(table(runs, pairs, others))
    if args.answers:
        print("\n" + answers(runs))
    if square := two_by_two(runs):
        print("\n" + square)
    if rounds := iterations(args.folder):
        print("\n" + rounds)
    if teachers := teacher_samples(args.folder):
        print("\n" + teachers)
    if args.steps and (table_of_steps := steps(args.folder)):
        print("\n" + table_of_steps)


if __name__ == "__main__":
    main()
