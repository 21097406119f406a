"""Passage retrieval quality: recall@k of supporting passages for bm25, dense and hybrid search.

    python bench/retrieval.py hotpotqa /work/shared/data/hotpotqa/dev_a.jsonl --store bench/out/hp_a

Ingests the pooled corpus of the dataset file into an embedded store (an existing --store
directory is reused, so a second run only queries), then for every question measures
recall@k = fraction of its supporting titles found among the titles of the top-k hits.
Target: hybrid >= best single mode + 3 points, checked at every k.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mhqa_graph.ingest.datasets import QAItem, questions
from mhqa_graph.ingest.runner import ingest_dataset
from mhqa_graph.store import open_store

KS = (2, 5, 10)
MODES = ("bm25", "dense", "hybrid")
TARGET_POINTS = 3.0
CORPUS = "bench"


def recall(item: QAItem, titles: list[str]) -> float:
    """Fraction of the item's supporting titles among `titles`."""
    gold = set(item.supporting_titles)
    return len(gold & set(titles)) / len(gold)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", help="hotpotqa, 2wiki or musique")
    parser.add_argument("file", help="dataset file (its pooled contexts form the corpus)")
    parser.add_argument("--embedder", default="all-minilm-l6-v2")
    parser.add_argument("--store", help="store directory (reused if it exists); default: a temporary one")
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads (1 is faster on a busy machine)")
    args = parser.parse_args()
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)

    store_dir = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="mhqa-retrieval-"))
    store = open_store(f"embedded://{store_dir.resolve()}", embedder=args.embedder)
    print(f"store {store_dir}  embedder {store.embedder.spec}")

    start = time.perf_counter()
    report = ingest_dataset(store, args.dataset, args.file, CORPUS, skip_bad=True)
    print(f"ingest: {report.passages_seen} passages seen, {report.passages_added} added, "
          f"{time.perf_counter() - start:.1f} s")

    items = [q for q in questions(args.dataset, args.file, yield_errors=True)
             if isinstance(q, QAItem) and q.supporting_titles]
    print(f"{len(items)} questions with supporting titles")

    scores = {(m, k): [] for m in MODES for k in KS}
    latency = {m: [] for m in MODES}
    for item in items:
        for mode in MODES:
            t = time.perf_counter()
            hits = store.search(CORPUS, item.question, k=max(KS), mode=mode)
            latency[mode].append(time.perf_counter() - t)
            titles = [h.title for h in hits]
            for k in KS:  # prefixes suffice: hybrid's candidate depth is the same for every k <= 12
                scores[mode, k].append(recall(item, titles[:k]))
    store.close()

    mean = {key: 100 * statistics.fmean(v) for key, v in scores.items()}
    print(f"\n{'mode':8}" + "".join(f"{f'R@{k}':>8}" for k in KS) + f"{'p50 ms':>9}")
    for mode in MODES:
        print(f"{mode:8}" + "".join(f"{mean[mode, k]:8.1f}" for k in KS)
              + f"{1000 * statistics.median(latency[mode]):9.1f}")
    print()
    for k in KS:
        best_single = max(mean["bm25", k], mean["dense", k])
        gain = mean["hybrid", k] - best_single
        verdict = "PASS" if gain >= TARGET_POINTS else "FAIL"
        print(f"{verdict} R@{k}: hybrid {mean['hybrid', k]:.1f} vs best single {best_single:.1f} "
              f"({gain:+.1f} points, target +{TARGET_POINTS:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
