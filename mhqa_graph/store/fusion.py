"""Rank fusion for hybrid search, shared by every backend."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

RRF_K = 2  # tuned on HotpotQA dev_a (bench/retrieval.py): 60, the usual value, gave hybrid only +1..2.5 points


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hashable]], k: int = RRF_K) -> list[tuple[Hashable, float]]:
    """Fuse ranked id lists: score(id) = sum over lists of 1 / (k + rank). Best first, ties by first appearance."""
    scores: dict[Hashable, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])


def candidate_depth(k: int) -> int:
    """How many hits each single mode contributes before fusion."""
    return max(4 * k, 50)
