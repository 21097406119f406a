"""Record real-model transcripts for the replay tests (tests/test_recorded.py): one file per agent and
environment in tests/recorded/, holding every model call (exact prompt, stop sequences, raw output) and
every store read of a few dev questions, with the model, its sha256 and the date.

    python scripts/record_transcripts.py                      # all of PLAN, ~30 min on 2 cores
    python scripts/record_transcripts.py --only omne          # one agent after its prompts changed
    python scripts/record_transcripts.py --llm llamacpp:qwen2.5-coder-0.5b --questions 3

NO_STOP's runs call the model without the graph's stop sequences, as a provider without them does: Omne's
model then writes `<tool_response>` blocks of its own, which the graph must reject.

Questions are chosen by rule: from `--start` on, the first `--questions` whose gold answers differ
(PathQuestion files hold each path as three paraphrases in a row).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.calls import chat_model
from mhqa_graph.graphs.guards import selected

from mhqa_graph.eval.diagnostics import chain_json
from mhqa_graph.eval.environments import DEV_ENVIRONMENTS, open_environment
from mhqa_graph.eval.runner import graph_inputs, load_questions
from mhqa_graph.models.packs import file_sha256
from mhqa_graph.testing.replay import RecordingChatModel, RecordingStore, Transcript

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "tests" / "recorded"
PLAN = {  # agent -> environments (DEV_ENVIRONMENTS)
    "omne": ("pq2h", "2wiki-kg"),
    "opera": ("pq2h", "2wiki-kg", "hotpot"),
    "mujica": ("pq2h", "hotpot"),
    "rag": ("pq2h", "hotpot"),
    "direct": ("hotpot",),
}
NO_STOP = {"omne": ("pq2h",)}  # also recorded from a provider without stop sequences: `<agent>-<env>-nostop.json`


def pick(dataset: str, path: Path, start: int, n: int) -> list:
    chosen, answers = [], set()
    for item in load_questions(dataset, path, start=start, limit=start + 50 * n):
        if item.answers[0] not in answers:
            chosen.append(item)
            answers.add(item.answers[0])
        if len(chosen) == n:
            break
    return chosen


def record(agent: str, env: str, args: argparse.Namespace, pass_stop: bool = True) -> Path:
    dataset, rel = DEV_ENVIRONMENTS[env].dataset, DEV_ENVIRONMENTS[env].file
    path = args.data / rel
    with open_environment(args.store, dataset, path) as (store, built):
        on = sorted(selected("auto", agent))  # by name, not "auto": a replay runs these when the default set changes
        settings = {"corpus": built["corpus"], "graph": built["graph"], "guards": ",".join(on) or "none"}
        real = chat_model(make_context(agent, llm=args.llm), "any")
        llm, reads = RecordingChatModel(inner=real, pass_stop=pass_stop), RecordingStore(store)
        context = make_context(agent, llm=llm, store=reads, **settings)
        graph = build_graph(agent)
        questions = []
        for item in pick(dataset, path, args.start, args.questions):
            started = time.perf_counter()
            out = graph.invoke(graph_inputs(item), context=context)
            questions.append({**graph_inputs(item), "id": item.id, "answers": list(item.answers),
                              "chain": chain_json(item.chain),
                              "output": {"answer": out.get("answer", ""), "error": out.get("error")}})
            print(f"  {agent}/{env} {item.id}: {out.get('answer', '')!r} (gold {item.answers[0]!r}) "
                  f"{out.get('error') or ''} {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
    gguf = Path(getattr(real, "model_path", "") or "")
    meta = {"agent": agent, "environment": env, "dataset": dataset, "file": rel, "settings": settings,
            "model": args.llm, "sha256": file_sha256(gguf) if gguf.is_file() else None, "stop_sequences": pass_stop,
            "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv)}
    transcript = Transcript(meta=meta, questions=questions, llm=llm.calls, store=reads.reads)
    return transcript.save(args.out / f"{agent}-{env}{'' if pass_stop else '-nostop'}.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llm", default="llamacpp:qwen2.5-coder-1.5b?threads=2")
    parser.add_argument("--only", action="append", choices=sorted(PLAN), help="repeatable; default: every agent")
    parser.add_argument("--env", action="append", choices=sorted(DEV_ENVIRONMENTS), help="repeatable; default: PLAN's")
    parser.add_argument("--questions", type=int, default=3)
    parser.add_argument("--start", type=int, default=100, help="first row considered (disjoint from bench slices)")
    parser.add_argument("--store", default=f"embedded://{ROOT / 'bench' / 'out' / 'store'}")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    runs = [(agent, env, True) for agent in PLAN for env in PLAN[agent]]
    runs += [(agent, env, False) for agent in NO_STOP for env in NO_STOP[agent]]
    for agent, env, pass_stop in runs:
        if (not args.only or agent in args.only) and (not args.env or env in args.env):
            print(f"wrote {record(agent, env, args, pass_stop)}", file=sys.stderr)


if __name__ == "__main__":
    main()
