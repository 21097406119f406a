"""Two runs over the same questions, compared per question: the paired-bootstrap interval of the mean
difference, the questions better and worse, and the sign test of those counts.

    paired_comparison(before_records, after_records)
    # {"paired": 100, "df1": 4.8, "df1_low": -1.2, "df1_high": 10.9, "better": 19, "worse": 11, "sign_p": 0.2}

Differences are in points (F1 x 100), as the benchmark tables show them.
"""

from __future__ import annotations

import math
import random
from typing import Any


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def paired_interval(diffs: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """The 95% paired-bootstrap interval of the mean of per-question differences, in F1 points."""
    if len(diffs) < 2:
        return None
    rng = random.Random(seed)
    means = sorted(_mean(rng.choices(diffs, k=len(diffs))) for _ in range(resamples))
    return 100 * means[int(0.025 * resamples)], 100 * means[int(0.975 * resamples) - 1]


def sign_test(better: int, worse: int) -> float:
    """The two-sided exact sign test: the chance of a split at least this uneven between `better` and `worse`
    questions (ties left out) if either direction were equally likely. 1.0 with no untied question."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(better, worse) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_comparison(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """`after` against `before` (eval records) over the questions both answered, by id: how many (`paired`),
    the mean F1 difference in points with its 95% paired-bootstrap interval (`df1`, `df1_low`,
    `df1_high`; None with fewer than 2 questions), the questions better and worse, and the sign test's p."""
    old = {str(r["id"]): r.get("f1") or 0.0 for r in before}
    diffs = [(r.get("f1") or 0.0) - old[str(r["id"])] for r in after if str(r["id"]) in old]
    interval = paired_interval(diffs)
    better, worse = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    return {"paired": len(diffs), "df1": 100 * _mean(diffs), "df1_low": interval[0] if interval else None,
            "df1_high": interval[1] if interval else None, "better": better, "worse": worse,
            "sign_p": sign_test(better, worse)}
