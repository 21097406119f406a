"""Two runs over the same questions, compared per question: the paired-bootstrap interval of the mean
difference, the questions better and worse, and the sign test of those counts.

    paired_comparison(before_records, after_records)
    # {"paired": 100, "clusters": 34, "df1": 4.8, "df1_low": -1.2, "df1_high": 10.9, "better": 19, "worse": 11,
    #  "sign_p": 0.2, "detectable": 8.6, "verdict": "within noise"}

The bootstrap resamples clusters, not questions: questions that share a gold path (PathQuestion asks each
path in about three paraphrases) are one cluster, so they are drawn together (`cluster_key`). Differences
are in points (F1 x 100), as the benchmark tables show them.

A target ("after is at least T points above before") is met when the interval's lower bound clears T, within
noise when the interval holds T, and missed when its upper bound is below T (`verdict`). `detectable` states
what such a comparison can see at all: the true difference it detects 80% of the time at the 5% level.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any, Literal


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def cluster_key(record: dict[str, Any]) -> str:
    """The record's cluster: its gold path (`chain`) where it has one, else its question id."""
    if record.get("cluster"):
        return str(record["cluster"])
    chain = record.get("chain")
    return json.dumps(chain, sort_keys=True) if chain else f"id:{record.get('id')}"


Z_DETECT = 1.96 + 0.84  # a two-sided 5% test detects a true difference of this many standard errors 80% of the time
Verdict = Literal["met", "within noise", "missed"]


def bootstrap_means(diffs: list[float], resamples: int = 2000, seed: int = 0,
                    clusters: list[str] | None = None) -> list[float] | None:
    """The sorted means of `resamples` cluster-bootstrap draws of `diffs` (whole clusters drawn, with `clusters`:
    one key per difference); None with fewer than 2 clusters."""
    groups: dict[str, list[float]] = {}
    for i, d in enumerate(diffs):
        groups.setdefault(clusters[i] if clusters else str(i), []).append(d)
    if len(groups) < 2:
        return None
    rng = random.Random(seed)
    parts = [(sum(g), len(g)) for g in groups.values()]
    means = []
    for _ in range(resamples):
        drawn = rng.choices(parts, k=len(parts))
        means.append(sum(s for s, _ in drawn) / sum(n for _, n in drawn))
    return sorted(means)


def paired_interval(diffs: list[float], resamples: int = 2000, seed: int = 0,
                    clusters: list[str] | None = None) -> tuple[float, float] | None:
    """The 95% paired-bootstrap interval of the mean of per-question differences, in F1 points. With `clusters`
    (one key per difference) whole clusters are resampled; fewer than 2 clusters give None."""
    return interval_and_detectable(diffs, clusters, resamples, seed)[0]


def detectable(diffs: list[float], clusters: list[str] | None = None) -> float | None:
    """The smallest true mean difference, in points, that a comparison of this many questions and clusters, this
    spread, detects 80% of the time at the 5% level (two-sided): `Z_DETECT` bootstrap standard errors."""
    return interval_and_detectable(diffs, clusters)[1]


def interval_and_detectable(diffs: list[float], clusters: list[str] | None = None, resamples: int = 2000,
                            seed: int = 0) -> tuple[tuple[float, float] | None, float | None]:
    """`paired_interval` and `detectable` of one bootstrap; (None, None) with fewer than 2 clusters."""
    means = bootstrap_means(diffs, resamples, seed, clusters)
    if means is None:
        return None, None
    mean = sum(means) / len(means)
    spread = math.sqrt(sum((m - mean) ** 2 for m in means) / (len(means) - 1))
    return (100 * means[int(0.025 * resamples)], 100 * means[int(0.975 * resamples) - 1]), 100 * Z_DETECT * spread


def verdict(low: float | None, high: float | None, target: float = 0.0) -> Verdict | None:
    """A target read from an interval: met when its lower bound clears `target`, missed when its upper bound is
    below it, else within noise (None without an interval)."""
    if low is None or high is None:
        return None
    return "met" if low > target else "missed" if high < target else "within noise"


def sign_test(better: int, worse: int) -> float:
    """The two-sided exact sign test: the chance of a split at least this uneven between `better` and `worse`
    questions (ties left out) if either direction were equally likely. 1.0 with no untied question."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(better, worse) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_comparison(before: list[dict[str, Any]], after: list[dict[str, Any]],
                      target: float = 0.0) -> dict[str, Any]:
    """`after` against `before` (eval records) over the questions both answered, by id: how many (`paired`),
    the mean F1 difference in points with its 95% paired-bootstrap interval (`df1`, `df1_low`,
    `df1_high`; None with fewer than 2 clusters), the clusters resampled (`cluster_key`), the questions better
    and worse, the sign test's p, the smallest difference such a comparison detects (`detectable`) and the
    `verdict` on "after is at least `target` points above before" (`verdict`)."""
    old = {str(r["id"]): r.get("f1") or 0.0 for r in before}
    pairs = [r for r in after if str(r["id"]) in old]
    diffs = [(r.get("f1") or 0.0) - old[str(r["id"])] for r in pairs]
    keys = [cluster_key(r) for r in pairs]
    interval, smallest = interval_and_detectable(diffs, keys)
    better, worse = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    low, high = interval if interval else (None, None)
    return {"paired": len(diffs), "clusters": len(set(keys)), "df1": 100 * _mean(diffs), "df1_low": low,
            "df1_high": high, "better": better, "worse": worse, "sign_p": sign_test(better, worse),
            "detectable": smallest, "target": target, "verdict": verdict(low, high, target)}
