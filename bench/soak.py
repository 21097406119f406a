"""Soak: 1,000 questions through `run_eval` (agent rag, a fake model with small latency, 32 in flight)
against one embedded store. Prints throughput, errors (must be 0) and resident memory at the start,
after 100 questions and at the end.

    python bench/soak.py [--questions 1000] [--concurrency 32] [--latency 0.01] [--max-growth-mb 64]

PASS when every question is recorded exactly once without an error, and RSS grows by less than
`--max-growth-mb` between question 100 (caches, thread pools and the store are warm by then) and the end.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import threading
import time
from pathlib import Path

from eval_throughput import synthetic_hotpotqa

from mhqa_graph.eval import environment_name, prepare, run_eval
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel


def rss_mb() -> float:
    """Resident set size of this process in MB (psutil if installed, else /proc/self/status)."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        status = Path("/proc/self/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024


def answer_from_passages(messages) -> str:
    """The county named in the first passage shown: deterministic, and right for most questions."""
    found = re.search(r"County \d+", messages[-1].text)
    return f"<answer>{found.group(0) if found else 'unknown'}</answer>"


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--latency", type=float, default=0.01)
    ap.add_argument("--max-growth-mb", type=float, default=64.0)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        data = synthetic_hotpotqa(Path(tmp) / "soak.jsonl", args.questions)
        store_uri = f"embedded://{tmp}/store?embedder=hash"
        with open_store(store_uri) as store:  # build the environment before timing
            prepare(store, "hotpotqa", data, environment_name("hotpotqa", data))
        out = Path(tmp) / "run"
        results = out / "results.jsonl"
        model = FakeChatModel(respond=answer_from_passages, latency=args.latency)
        marks = {"start": rss_mb()}
        done = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                run_eval("rag", "hotpotqa", data, None, store_uri, out, concurrency=args.concurrency,
                         context_overrides={"llm": model}, progress=False)
            except BaseException as exc:
                failure.append(exc)
            finally:
                done.set()

        started = time.perf_counter()
        worker = threading.Thread(target=run)
        worker.start()
        while not done.wait(0.02):
            if "q100" not in marks and count_lines(results) >= min(100, args.questions):
                marks["q100"] = rss_mb()
        worker.join()
        wall = time.perf_counter() - started
        marks["end"] = rss_mb()
        if failure:
            raise failure[0]

        records = [json.loads(line) for line in results.read_bytes().splitlines()]
        ids = [r["id"] for r in records]
        errors = [r for r in records if r["failed"] or r["error"]]
        em = sum(r["em"] for r in records) / max(1, len(records))
        marks.setdefault("q100", marks["end"])
        growth = marks["end"] - marks["q100"]

    print(f"questions: {len(records)} (unique {len(set(ids))}), concurrency {args.concurrency}, "
          f"model latency {args.latency * 1000:.0f} ms, model calls {len(model.calls)}")
    print(f"throughput: {len(records) / wall:.1f} q/s ({wall:.1f} s wall), EM {em:.3f}")
    print(f"errors: {len(errors)}" + (f" (first: {errors[0]['error']})" if errors else ""))
    print(f"RSS MB: start {marks['start']:.1f}, after 100 {marks['q100']:.1f}, end {marks['end']:.1f}; "
          f"growth start->end {marks['end'] - marks['start']:+.1f}, after 100->end {growth:+.1f} "
          f"({1024 * growth / max(1, len(records) - 100):.1f} KB/question)")
    checks = {
        "every question recorded exactly once": sorted(ids) == sorted(f"s{i}" for i in range(args.questions)),
        "no errors": not errors,
        f"RSS growth after question 100 < {args.max_growth_mb:.0f} MB": growth < args.max_growth_mb,
    }
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {name}")
    raise SystemExit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
