"""The model calls of the recorded transcripts, replayed through a llama.cpp model with its prefix cache off
and on, in one run: prompt tokens prefilled, wall time and whether the greedy replies are the same.

    python bench/serving.py                                   # tests/recorded/*.json, ~15 min on 2 cores
    python bench/serving.py --llm llamacpp:qwen2.5-coder-0.5b --only mujica
    python bench/serving.py --parallel                        # Mujica's worker rounds: llama-server, N slots vs 1
    python bench/serving.py --runs bench/out/runs/llamacpp_qwen2.5-coder-1.5b/pq2h   # no model: reuse in eval traces
    python bench/serving.py --eval pq2h,hotpot --start 100 --limit 20   # whole evals, cache off and on side by side
    python bench/serving.py --backends qwen2.5-coder-0.5b --record bench/results/serving-backends.json
    python bench/serving.py --threads --load 4 --llm llamacpp:qwen2.5-coder-0.5b   # 1 thread vs all, on busy cores

Each agent's transcripts (several questions each) run in recorded order through a freshly loaded model: first
each call from an empty context (`forget`: the replies every other run must repeat), then with the prompt
prefilled in aligned chunks (the default) and with llama.cpp's own batching (`chunk=0`, as before replies were
made to repeat), each with `cache=0` (the previous call's context is reused only) and with the default prefix
cache. A call's reply is capped at the length recorded for it, so every run decodes the same amount. The table
gives each run's prompt tokens prefilled, seconds, speed-up against the fresh run and replies equal to its.

`--runs` reads the traced prompts of finished eval runs (whole runs, so later questions reuse what earlier
ones prefilled) and counts, by characters, what a cache of the `--slots` most recent prompts leaves to prefill
against llama.cpp's reuse of the previous prompt's prefix alone. It runs no model: an estimate of the cache's
share, which eval records now measure as `tokens.cached`.

`--eval ENVS` runs `bench/agents.py` on those environments twice at the same time, one eval process with
`cache=0` and one with the cache (one llama.cpp thread each, so both see the same load), into
`bench/out/serving/`, and prints per environment and agent: seconds per question, prompt tokens prefilled
per question, the ratios on / off, answers that are the same, and F1 off and on. `--report-only` prints the
table from finished runs.

`--parallel` takes the worker calls of each Mujica planner round that sent several (the calls LangGraph's
`Send` makes at once) and sends each round's calls at the same time to llama.cpp's server (`--llm` with
`slots=N`, see mhqa_graph.models.server), once with one slot (the calls wait their turn) and once with as
many slots as the largest round has workers (decoded together in one batch): wall time and whether the
greedy replies are the same. They need not be: how calls share a batch changes the arithmetic, and with it
a near tie between two tokens (with several slots, even two runs of the same command may differ).

`--backends PACK` replays the `--calls` longest recorded calls (all agents) through llama.cpp (`llamacpp:PACK`, one
thread) and through transformers (the pack's weights, as a training run's policy is served without llama.cpp), one
after the other in one run: seconds per call for each, the ratio, and the replies that are the same (llama.cpp's Q4
weights are not transformers' float32 ones, so they need not be). `--record FILE` also writes the row as JSON.

`--threads` replays Mujica's worker rounds (as `--parallel`) through llama-server with 2 slots, once with one thread
and once with a thread per core, while `--load` processes keep cores busy (as a trainer, a benchmark or the tests
do beside a rollout): wall time for each and the ratio (`--record FILE` writes it as JSON).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from langchain_core.messages import convert_to_messages
from mhqa_graph.graphs.mujica.prompts import GRAPH_WORKER_SYSTEM, WORKER_SYSTEM

from mhqa_graph.eval.report import RESULTS, prefilled_per_question, read_records
from mhqa_graph.models.factory import load_chat_model
from mhqa_graph.models.prefix_cache import common_prefix

BENCH = Path(__file__).resolve().parent
RECORDED = BENCH.parent / "tests" / "recorded"


def transcript_calls(folder: Path, only: set[str]) -> dict[str, list[dict]]:
    """Agent -> its recorded model calls, transcript by transcript in file-name order."""
    calls: dict[str, list[dict]] = defaultdict(list)
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        agent = (data.get("meta") or {}).get("agent")
        if agent and isinstance(data.get("llm"), dict) and (not only or agent in only):
            calls[agent] += data["llm"].values()
    return dict(calls)


def worker_rounds(calls: list[dict]) -> list[list[dict]]:
    """The runs of consecutive Mujica worker calls (one planner round's `Send`s) that hold several calls."""
    rounds: list[list[dict]] = [[]]
    for call in calls:
        if call["messages"][0]["content"] in (WORKER_SYSTEM, GRAPH_WORKER_SYSTEM):
            rounds[-1].append(call)
        elif rounds[-1]:
            rounds.append([])
    return [r for r in rounds if len(r) > 1]


def ask(model, call: dict):
    """One recorded call, its reply capped at the recorded length."""
    return model.invoke(convert_to_messages(call["messages"]), stop=call["stop"] or None,
                        max_new_tokens=max(1, call["output_tokens"]))


def loaded(spec: str):
    model = load_chat_model(spec)
    model.invoke("Hi", max_new_tokens=1)  # loaded before the clock starts
    return model


def replay(spec: str, calls: list[dict], fresh: bool = False) -> dict:
    """Run `calls` through a model loaded from `spec`; totals and the replies. `fresh`: each call from an empty
    context and prefix cache (`forget`), the replies every other way of running them must give."""
    model = loaded(spec)
    started, prompt, prefilled, replies = time.perf_counter(), 0, 0, []
    for call in calls:
        if fresh:
            model.forget()
        reply = ask(model, call)
        usage = reply.usage_metadata
        prompt += usage["input_tokens"]
        prefilled += usage["input_tokens"] - usage.get("input_token_details", {}).get("cache_read", 0)
        replies.append(reply.text)
    return {"seconds": time.perf_counter() - started, "prompt": prompt, "prefilled": prefilled, "replies": replies}


def replay_rounds(spec: str, rounds: list[list[dict]]) -> dict:
    """Each round's calls sent at once to a model loaded from `spec`, round after round; wall time and replies."""
    from mhqa_graph.models.server import stop_all

    model = loaded(spec)
    try:
        started, replies = time.perf_counter(), []
        for calls in rounds:
            with ThreadPoolExecutor(len(calls)) as pool:
                replies += [r.text for r in pool.map(lambda call: ask(model, call), calls)]
        return {"seconds": time.perf_counter() - started, "replies": replies}
    finally:
        stop_all()  # one model process at a time


def parallel(args: argparse.Namespace, sep: str) -> None:
    rounds = worker_rounds(transcript_calls(args.recorded, {"mujica"}).get("mujica", []))
    if not rounds:
        raise SystemExit(f"no Mujica round with several workers in {args.recorded}")
    calls, slots = sum(len(r) for r in rounds), max(len(r) for r in rounds)
    one = replay_rounds(f"{args.llm}{sep}slots=1", rounds)
    many = replay_rounds(f"{args.llm}{sep}slots={slots}", rounds)
    same = sum(a == b for a, b in zip(one["replies"], many["replies"]))
    print(f"| rounds | worker calls | s, 1 slot | s, {slots} slots | speed-up | same replies |\n"
          f"|---|---|---|---|---|---|\n| {len(rounds)} | {calls} | {one['seconds']:.1f} | {many['seconds']:.1f} | "
          f"{one['seconds'] / many['seconds']:.2f}x | {same}/{calls} |")


def backends(args: argparse.Namespace) -> None:
    """The longest recorded calls through llama.cpp and through transformers (see the module docstring)."""
    calls = sorted((c for agent_calls in transcript_calls(args.recorded, set()).values() for c in agent_calls),
                   key=lambda c: -len(prompt_text(c)))[:args.calls]
    if not calls:
        raise SystemExit(f"no recorded calls in {args.recorded}")
    runs = {"llamacpp": replay(f"llamacpp:{args.backends}?threads=1", calls), "transformers": replay(args.backends,
                                                                                                    calls)}
    row = {"pack": args.backends, "calls": len(calls), "prompt_tokens": runs["llamacpp"]["prompt"] / len(calls),
           "reply_tokens": sum(c["output_tokens"] for c in calls) / len(calls),
           **{f"s_{k}": run["seconds"] / len(calls) for k, run in runs.items()},
           "same_replies": sum(a == b for a, b in zip(runs["llamacpp"]["replies"], runs["transformers"]["replies"]))}
    row["ratio"] = row["s_transformers"] / row["s_llamacpp"]
    print("| pack | calls | prompt tokens/call | reply tokens/call | s/call llama.cpp | s/call transformers | ratio | "
          f"same replies |\n|---|---|---|---|---|---|---|---|\n| {args.backends} | {len(calls)} | "
          f"{row['prompt_tokens']:,.0f} | {row['reply_tokens']:.0f} | {row['s_llamacpp']:.1f} | "
          f"{row['s_transformers']:.1f} | {row['ratio']:.1f}x | {row['same_replies']}/{len(calls)} |")
    if args.record:
        args.record.write_text(json.dumps(row, indent=2) + "\n", encoding="utf-8")


def spin(stop) -> None:
    """Keep one core busy until `stop` is set: the other work of a loaded machine."""
    while not stop.is_set():
        sum(range(10_000))


def threads(args: argparse.Namespace, sep: str) -> None:
    """Worker rounds through 2 slots with 1 thread and with a thread per core, beside `--load` busy processes."""
    rounds = worker_rounds(transcript_calls(args.recorded, {"mujica"}).get("mujica", []))
    if not rounds:
        raise SystemExit(f"no Mujica round with several workers in {args.recorded}")
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        raise SystemExit("--threads compares one thread with one per core: it needs 2 cores or more")
    stop = multiprocessing.Event()
    busy = [multiprocessing.Process(target=spin, args=(stop,), daemon=True) for _ in range(args.load)]
    for p in busy:
        p.start()
    try:
        runs = {n: replay_rounds(f"{args.llm}{sep}slots=2&threads={n}", rounds) for n in (1, cores)}
    finally:
        stop.set()
        for p in busy:
            p.join()
    calls, one, many = sum(len(r) for r in rounds), runs[1]["seconds"], runs[cores]["seconds"]
    print(f"| cores | busy processes | rounds | worker calls | s, 1 thread | s, {cores} threads | ratio |\n"
          f"|---|---|---|---|---|---|---|\n| {cores} | {args.load} | {len(rounds)} | {calls} | {one:.1f} | "
          f"{many:.1f} | {many / one:.2f} |")
    if args.record:
        args.record.write_text(json.dumps({"llm": args.llm, "cores": cores, "load": args.load, "rounds": len(rounds),
                                           "calls": calls, "s_1_thread": one, f"s_{cores}_threads": many,
                                           "ratio": many / one}, indent=2) + "\n", encoding="utf-8")


def prompt_text(call: dict) -> str:
    """A traced call's prompt as one string, in the layout of a chat template (roles, then contents)."""
    return "".join(f"<{m['role']}>\n{m['content']}\n" for m in call["messages"])


def reuse(prompts: list[str], slots: int) -> tuple[int, int, int]:
    """Characters of `prompts` (in call order): in all, left to prefill when only the previous prompt's prefix
    is reused (llama.cpp's own context), and when the longest shared prefix of the `slots` most recent is."""
    total = previous = recent = 0
    for i, text in enumerate(prompts):
        total += len(text)
        previous += len(text) - (common_prefix(text, prompts[i - 1]) if i else 0)
        recent += len(text) - max((common_prefix(text, p) for p in prompts[max(0, i - slots):i]), default=0)
    return total, previous, recent


def runs_reuse(folder: Path, slots: int) -> None:
    """Per agent run under `folder` (an environment's run folders): the prompt characters a prefix cache of
    `slots` recent prompts leaves to prefill, against llama.cpp's reuse of the previous prompt only; no model."""
    print(f"| run | questions | calls | prompt chars | prefilled, previous prefix | prefilled, {slots} recent "
          "| ratio |\n|---|---|---|---|---|---|---|")
    for results in sorted(folder.glob("*/results.jsonl")):
        records = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines() if line.strip()]
        prompts = [prompt_text(c) for r in records for c in (r.get("trace") or {}).get("llm_calls", [])]
        if prompts:
            total, previous, recent = reuse(prompts, slots)
            print(f"| {results.parent.name} | {len(records)} | {len(prompts)} | {total:,} | {previous:,} | "
                  f"{recent:,} | {recent / previous:.2f} |")


def eval_speed(args: argparse.Namespace, sep: str) -> None:
    """Whole evals with the cache off and on, side by side (see the module docstring), and their table."""
    sys.path.insert(0, str(BENCH))
    from agents import build_environments, run_dir, start, stopping_children, wait
    from variants import asked_ids

    specs = {"off": f"{args.llm}{sep}cache=0", "on": args.llm}
    envs = [e for e in args.eval.split(",") if e]
    if not args.report_only:
        build_environments(args.store, args.data, envs)  # before two processes open the store read-only
        common = [a for e in envs for a in ("--env", e)] + ["--agents", args.agents, "--start", str(args.start),
                                                           "--limit", str(args.limit), "--jobs", "1", "--store",
                                                           args.store, "--out", str(args.out), "--data", str(args.data)]
        with ExitStack() as stack:
            logs = {k: stack.enter_context((args.out / f"serving-{k}.log").open("w", encoding="utf-8")) for k in specs}
            stack.enter_context(stopping_children())
            procs = [start([sys.executable, str(BENCH / "agents.py"), "--llm", spec, *common],
                           stdout=logs[k], stderr=subprocess.STDOUT) for k, spec in specs.items()]
            failed = [wait(p) for p in procs]
        if any(failed):
            raise SystemExit(f"an eval failed; see {args.out}/serving-off.log and serving-on.log")
    print("| environment | agent | questions | s/q off | s/q on | ratio | prefilled/q off | prefilled/q on | ratio | "
          "same answers | F1 off | F1 on |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    for env in envs:
        asked = asked_ids(args, env)
        for agent in args.agents.split(","):
            runs = {k: {r["id"]: r for r in read_records(run_dir(args.out, spec, env, agent) / RESULTS)
                        if r["id"] in asked} for k, spec in specs.items()}
            row = speed_row(runs["off"], runs["on"])
            if row:
                print(f"| {env} | {agent} | {row['n']} | {row['sec_off']:.1f} | {row['sec_on']:.1f} | "
                      f"{row['sec_ratio']:.2f} | {row['pre_off']:,.0f} | {row['pre_on']:,.0f} | "
                      f"{row['pre_ratio']:.2f} | {row['same']}/{row['n']} | {row['f1_off']:.1f} | {row['f1_on']:.1f} |")


def speed_row(off: dict[str, dict], on: dict[str, dict]) -> dict | None:
    """Cache off against on over the questions both runs answered (records by id): seconds and prompt tokens
    prefilled per question, their ratios on / off, answers that are the same, F1 (points); None if none."""
    ids = sorted(set(off) & set(on))
    if not ids:
        return None
    row: dict = {"n": len(ids), "same": sum(off[i]["prediction"] == on[i]["prediction"] for i in ids)}
    for key, runs in (("off", off), ("on", on)):
        records = [runs[i] for i in ids]
        row[f"sec_{key}"] = sum(r["latency"] for r in records) / len(ids)
        row[f"pre_{key}"] = prefilled_per_question(records) or 0.0
        row[f"f1_{key}"] = 100 * sum(r["f1"] for r in records) / len(ids)
    row["sec_ratio"] = row["sec_on"] / row["sec_off"]
    row["pre_ratio"] = row["pre_on"] / max(row["pre_off"], 1.0)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llm", default="llamacpp:qwen2.5-coder-1.5b?threads=1")
    parser.add_argument("--only", default="", help="comma-separated agents")
    parser.add_argument("--recorded", type=Path, default=RECORDED)
    parser.add_argument("--parallel", action="store_true", help="Mujica's worker rounds through llama-server, "
                                                                   "as many slots as workers vs one")
    parser.add_argument("--runs", type=Path, help="an environment's eval run folders (bench/out/runs/<llm>/<env>): "
                                                   "count the prefix reuse of their traced prompts, run no model")
    parser.add_argument("--backends", metavar="PACK", help="recorded calls through llama.cpp and transformers")
    parser.add_argument("--calls", type=int, default=4, help="with --backends: the longest recorded calls")
    parser.add_argument("--record", type=Path, help="with --backends or --threads: write the row as JSON here")
    parser.add_argument("--threads", action="store_true", help="llama-server with 1 thread vs one per core")
    parser.add_argument("--load", type=int, default=0, help="with --threads: busy processes beside it")
    parser.add_argument("--slots", type=int, default=40, help="with --runs: recent prompts the cache holds")
    parser.add_argument("--eval", default="", help="comma-separated environments of bench/agents.py: whole evals "
                                                   "with the cache off and on, side by side")
    parser.add_argument("--agents", default="rag,opera,mujica,omne", help="with --eval")
    parser.add_argument("--start", type=int, default=100, help="with --eval: the first question")
    parser.add_argument("--limit", type=int, default=20, help="with --eval: questions per environment")
    parser.add_argument("--data", type=Path, default=BENCH.parent.parent / "shared" / "data", help="with --eval")
    parser.add_argument("--out", type=Path, default=BENCH / "out" / "serving", help="with --eval")
    parser.add_argument("--report-only", action="store_true", help="with --eval: the table of finished runs")
    parser.add_argument("--store", default=f"embedded://{BENCH / 'out' / 'store'}",
                        help="with --eval: the store the evals read (default: bench/agents.py's, built once)")
    args = parser.parse_args()
    if args.runs:
        return runs_reuse(args.runs, args.slots)
    if args.backends:
        return backends(args)
    sep = "&" if "?" in args.llm else "?"
    if args.eval:
        return eval_speed(args, sep)
    if args.parallel:
        return parallel(args, sep)
    if args.threads:
        return threads(args, sep)
    rows = ["| agent | calls | prefill | cache | prompt tokens | prefilled | s | speed-up vs fresh | "
            "replies as fresh |", "|---|---|---|---|---|---|---|---|---|"]
    for agent, calls in transcript_calls(args.recorded, set(filter(None, args.only.split(",")))).items():
        fresh = replay(f"{args.llm}{sep}cache=0", calls, fresh=True)
        for prefill, chunk in (("aligned", ""), ("llama.cpp's", f"{sep}chunk=0")):
            for cache, option in (("off", "cache=0"), ("on", "")):
                spec = args.llm + chunk + (("&" if "?" in args.llm + chunk else "?") + option if option else "")
                run = replay(spec, calls)
                same = sum(a == b for a, b in zip(fresh["replies"], run["replies"]))
                rows.append(f"| {agent} | {len(calls)} | {prefill} | {cache} | {run['prompt']:,} | "
                            f"{run['prefilled']:,} | {run['seconds']:.0f} | {fresh['seconds'] / run['seconds']:.2f}x | "
                            f"{same}/{len(calls)} |")
                print(rows[-1], flush=True)
        rows.append(f"| {agent} | {len(calls)} | fresh | - | {fresh['prompt']:,} | {fresh['prefilled']:,} | "
                    f"{fresh['seconds']:.0f} | 1.00x | {len(calls)}/{len(calls)} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
