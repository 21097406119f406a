"""Mujica fan-out cost: does a round of 3 parallel workers take as long as a round of 1?

    python bench/fanout.py [--latency 0.2] [--repeats 9] [--faiss-threads 1]

Every model call is a FakeChatModel sleeping `latency` seconds. Question A: the planner emits 3
independent sub-questions, then concludes (5 calls, 3 on the critical path); question B: 1
sub-question, then concludes (3 calls, 3 on the critical path). Reports the best (least
disturbed by other load) and median wall time of each under `invoke` and `ainvoke`; verdicts use
the best: their ratio (target <= 1.25) and the framework overhead per model call,
(wall - critical_calls * latency) / calls (target <= 5 ms); store searches count as overhead.
`--faiss-threads 1` takes faiss's OpenMP start-up cost (~10 ms per query on a 2-core machine)
out of each store search.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time

import mhqa_graph.graphs.mujica.graph as mujica
from mhqa_graph.graphs.mujica import MujicaContext

from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.types import Passage

TARGET_RATIO = 1.25
TARGET_OVERHEAD_MS = 5.0
CRITICAL_CALLS = 3  # planner, one worker wave, planner
QUESTIONS = ["What is the capital of France?", "What is the capital of Germany?", "What is the capital of Italy?"]
PASSAGES = [Passage("p1", "Paris", "Paris is the capital of France."),
            Passage("p2", "Berlin", "Berlin is the capital of Germany."),
            Passage("p3", "Rome", "Rome is the capital of Italy.")]


def models(n_sub: int, latency: float) -> tuple[FakeChatModel, FakeChatModel]:
    plan = json.dumps({"subquestions": [{"id": f"q{i + 1}", "question": q, "depends_on": []}
                                        for i, q in enumerate(QUESTIONS[:n_sub])]})
    planner = FakeChatModel(respond=lambda m: plan if "Turn 1 of" in m[-1].text else '{"answer": "Paris"}',
                            latency=latency)
    worker = FakeChatModel(responses=['{"relevant": [1], "answer": "Paris"}'], latency=latency)
    return planner, worker


def run(store, n_sub: int, latency: float, entry: str) -> tuple[float, int]:
    """Wall seconds of one run and its number of model calls."""
    planner, worker = models(n_sub, latency)
    ctx = MujicaContext(role_llms={"planner": planner, "worker": worker}, store=store, corpus="bench")
    question = {"question": "What are the capitals of France, Germany and Italy?"}
    t = time.perf_counter()
    if entry == "invoke":
        out = mujica.graph.invoke(question, context=ctx)
    else:
        out = asyncio.run(mujica.graph.ainvoke(question, context=ctx))
    wall = time.perf_counter() - t
    assert len(out["results"]) == n_sub and out["answer"] == "Paris", out
    return wall, len(planner.calls) + len(worker.calls)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per model call")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--faiss-threads", type=int, default=0, help="OpenMP threads for faiss; 0 = its default")
    args = parser.parse_args()
    if args.faiss_threads:
        import faiss

        faiss.omp_set_num_threads(args.faiss_threads)
    ok = True
    with tempfile.TemporaryDirectory() as tmp, open_store(f"embedded://{tmp}/s?embedder=hash") as store:
        store.add_passages("bench", PASSAGES)
        run(store, 3, 0.0, "invoke")  # warm up imports and the store
        for entry in ("invoke", "ainvoke"):
            walls, calls = {}, {}
            for n_sub in (3, 1):
                times = []
                for _ in range(args.repeats):
                    wall, calls[n_sub] = run(store, n_sub, args.latency, entry)
                    times.append(wall)
                walls[n_sub] = min(times)
                print(f"{entry}: {n_sub} sub-question{'s' if n_sub > 1 else ''}, {calls[n_sub]} calls: "
                      f"best {min(times):.3f} s, median {statistics.median(times):.3f} s")
            ratio = walls[3] / walls[1]
            verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
            ok &= verdict == "PASS"
            print(f"{verdict} {entry} fan-out ratio {ratio:.3f} <= {TARGET_RATIO}")
            for n_sub in (3, 1):
                overhead = (walls[n_sub] - CRITICAL_CALLS * args.latency) / calls[n_sub] * 1000
                verdict = "PASS" if overhead <= TARGET_OVERHEAD_MS else "FAIL"
                ok &= verdict == "PASS"
                print(f"{verdict} {entry} overhead per model call ({n_sub} sub-question"
                      f"{'s' if n_sub > 1 else ''}) {overhead:.2f} ms <= {TARGET_OVERHEAD_MS} ms")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
