"""How well `rag`'s confidence in its answer separates its right answers from its wrong ones: the probability the
model gave the answer's least likely token (`rag:confidence=true`, `mhqa_graph.models.logprobs`), read from the
committed records of `bench/agents.py`. It is how `auto`'s `min_confidence` was chosen (on questions 0-59); `auto`
with it is measured by `bench/agents.py` on other questions.

    python bench/agents.py --start 0 --limit 60 --env hotpot --env pq2h --env 2wiki-kg --agents rag:confidence=true
    python bench/confidence.py --start 0 --limit 60 --env hotpot --env pq2h --env 2wiki-kg

Per environment: the area under the ROC curve of confidence for right answers (F1 >= 0.5), and per threshold the
answers below it with `rag`'s F1 on them and on the rest. On a graph, the same for the answers that name an entity
the question does not (those `auto` escalates without looking at confidence).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import records as R
from variants import DATA, asked_ids

from mhqa_graph.eval.environments import DEV_ENVIRONMENTS
from mhqa_graph.eval.runner import load_questions
from mhqa_graph.parsing import words

VARIANT = "rag:confidence=true"
THRESHOLDS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
RIGHT = 0.5  # F1 at which an answer counts as right


def auroc(scores: list[float], right: list[bool]) -> float | None:
    """The probability that a right answer has a higher score than a wrong one (ties count half)."""
    pos = [s for s, r in zip(scores, right) if r]
    neg = [s for s, r in zip(scores, right) if not r]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def _f1(rows: list[dict]) -> str:
    return f"{100 * sum(r['f1'] for r in rows) / len(rows):.1f}" if rows else "-"


def table(rows: list[dict], title: str) -> list[str]:
    scored = [r for r in rows if r.get("confidence") is not None]
    area = auroc([r["confidence"] for r in scored], [r["f1"] >= RIGHT for r in scored])
    out = [f"{title}: {len(scored)} answers with a confidence, rag F1 {_f1(scored)}, right (F1 >= {RIGHT}) "
           f"{sum(r['f1'] >= RIGHT for r in scored)}, AUROC {'-' if area is None else f'{area:.2f}'}", "",
           "| threshold | below | rag F1 below | rag F1 at or above |", "|---|---|---|---|"]
    for t in THRESHOLDS:
        low = [r for r in scored if r["confidence"] < t]
        high = [r for r in scored if r["confidence"] >= t]
        out.append(f"| {t} | {len(low)} | {_f1(low)} | {_f1(high)} |")
    return out + [""]


def report(args: argparse.Namespace, env: str) -> list[str]:
    spec = DEV_ENVIRONMENTS[env]
    wanted = asked_ids(args, env)
    rows = [r for r in R.load(R.path_of(args.llm, env, VARIANT, args.results)) if r["id"] in wanted]
    out = table(rows, f"{env}, questions {args.start}-{args.start + args.limit - 1}")
    if spec.kind == "kg":
        questions = {q.id: q.question for q in load_questions(spec.dataset, args.data / spec.file, limit=args.limit,
                                                               start=args.start)}
        unnamed = [r for r in rows if (said := words(r.get("prediction") or "")) not in ("", "yes", "no")
                   and f" {said} " not in f" {words(questions.get(r['id'], ''))} "]
        out += table(unnamed, f"{env}, answers that name an entity the question does not")
    return out


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", action="append", choices=sorted(DEV_ENVIRONMENTS), required=True)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--llm", default="llamacpp:qwen2.5-coder-1.5b")
    parser.add_argument("--results", type=Path, default=R.RESULTS_DIR)
    parser.add_argument("--data", type=Path, default=DATA)
    return parser


def reports(args: argparse.Namespace) -> str:
    """The tables of each environment of `args`, from the committed records (runs no model)."""
    return "\n".join(line for env in args.env for line in report(args, env)).strip()


def main() -> None:
    print(reports(arguments().parse_args()))


if __name__ == "__main__":
    main()
