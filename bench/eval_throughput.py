"""Throughput of `run_eval`: questions in flight vs one at a time, with a model of fixed latency.

    python bench/eval_throughput.py [--questions 100] [--latency 0.2] [--concurrency 16] [--repeat 2]
                                    [--file F --dataset D]

The `rag` agent makes one model call per question; the fake model sleeps `--latency` seconds per
call. The store (hash embedder, in a temporary folder) is built before timing; each timing is a
whole `run_eval` into a fresh run folder, the best of `--repeat` (as `timeit` does: the other
runs only add noise from other processes). PASS if `--concurrency K` is at least `--target`
times faster than `--concurrency 1`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from mhqa_graph.eval import environment_name, prepare, run_eval
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel


def synthetic_hotpotqa(path: Path, n: int) -> Path:
    """`n` HotpotQA-layout rows, each with a supporting and a filler paragraph."""
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            title = f"Town {i}"
            f.write(json.dumps({
                "id": f"s{i}", "question": f"In which county is the town number {i} located?",
                "answer": f"County {i % 17}", "type": "bridge", "level": "easy",
                "supporting_facts": {"title": [title], "sent_id": [0]},
                "context": {"title": [title, f"Fair {i}"],
                            "sentences": [[f"Town {i} is a town in County {i % 17}."],
                                          [f"The fair {i} takes place every summer."]]},
            }) + "\n")
    return path


def timed(k: int, args: argparse.Namespace, data: Path, store: str, root: Path) -> list[float]:
    """Wall times of `--repeat` complete runs with `k` questions in flight."""
    times = []
    for i in range(args.repeat):
        model = FakeChatModel(responses=["<answer>County 1</answer>"], latency=args.latency)
        start = time.perf_counter()
        summary = run_eval("rag", args.dataset, data, None, store, root / f"run-k{k}-{i}", limit=args.questions,
                           concurrency=k, context_overrides={"llm": model}, progress=False)
        times.append(time.perf_counter() - start)
        assert summary.n == args.questions and summary.failures == 0 and len(model.calls) == args.questions
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per model call")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--target", type=float, default=12.0, help="minimum speedup to PASS")
    parser.add_argument("--repeat", type=int, default=2, help="runs per setting; the best counts")
    parser.add_argument("--file", type=Path, help="a dataset file instead of synthetic questions")
    parser.add_argument("--dataset", default="hotpotqa")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = args.file or synthetic_hotpotqa(root / "synthetic.jsonl", args.questions)
        store = f"embedded://{root}/store?embedder=hash"
        with open_store(store) as st:  # build the environment outside the timings
            prepare(st, args.dataset, data, environment_name(args.dataset, data))
        one = timed(1, args, data, store, root)
        many = timed(args.concurrency, args, data, store, root)
    speedup = min(one) / min(many)
    ideal = args.questions * args.latency
    print(f"{args.questions} questions, rag, fake model {args.latency:.2f} s/call (sum of model time {ideal:.1f} s)")
    for k, times in ((1, one), (args.concurrency, many)):
        print(f"concurrency {k:>3}: {min(times):7.2f} s  (runs: {', '.join(f'{t:.2f}' for t in times)})")
    print(f"speedup {speedup:.1f}x (target >= {args.target:g}x): {'PASS' if speedup >= args.target else 'FAIL'}")


if __name__ == "__main__":
    main()
