"""The model calls of the recorded transcripts, replayed through a llama.cpp model with its prefix cache off
and on, in one run: prompt tokens prefilled, wall time and whether the greedy replies are the same.

    python bench/serving.py                                   # tests/recorded/*.json, ~15 min on 2 cores
    python bench/serving.py --llm llamacpp:qwen2.5-coder-0.5b --only mujica

Each agent's transcripts (several questions each) run in recorded order through a freshly loaded model,
once with `cache=0` (llama.cpp reuses the previous call's prefix only) and once with the default prefix
cache. A call's reply is capped at the length recorded for it, so both runs decode the same amount.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

from langchain_core.messages import convert_to_messages

from mhqa_graph.models.factory import load_chat_model

RECORDED = Path(__file__).resolve().parents[1] / "tests" / "recorded"


def transcript_calls(folder: Path, only: set[str]) -> dict[str, list[dict]]:
    """Agent -> its recorded model calls, transcript by transcript in file-name order."""
    calls: dict[str, list[dict]] = defaultdict(list)
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        agent = (data.get("meta") or {}).get("agent")
        if agent and isinstance(data.get("llm"), dict) and (not only or agent in only):
            calls[agent] += data["llm"].values()
    return dict(calls)


def replay(spec: str, calls: list[dict]) -> dict:
    """Run `calls` through a model loaded from `spec`; totals and the replies."""
    model = load_chat_model(spec)
    model.invoke("Hi", max_new_tokens=1)  # loaded before the clock starts
    started, prompt, prefilled, replies = time.perf_counter(), 0, 0, []
    for call in calls:
        reply = model.invoke(convert_to_messages(call["messages"]), stop=call["stop"] or None,
                             max_new_tokens=max(1, call["output_tokens"]))
        usage = reply.usage_metadata
        prompt += usage["input_tokens"]
        prefilled += usage["input_tokens"] - usage["input_token_details"]["cache_read"]
        replies.append(reply.text)
    return {"seconds": time.perf_counter() - started, "prompt": prompt, "prefilled": prefilled, "replies": replies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llm", default="llamacpp:qwen2.5-coder-1.5b?threads=1")
    parser.add_argument("--only", default="", help="comma-separated agents")
    parser.add_argument("--recorded", type=Path, default=RECORDED)
    args = parser.parse_args()
    sep = "&" if "?" in args.llm else "?"
    rows = ["| agent | calls | prompt tokens | prefilled, cache off | prefilled, cache on | s, off | s, on | "
            "speed-up | same replies |", "|---|---|---|---|---|---|---|---|---|"]
    for agent, calls in transcript_calls(args.recorded, set(filter(None, args.only.split(",")))).items():
        off, on = replay(f"{args.llm}{sep}cache=0", calls), replay(args.llm, calls)
        same = sum(a == b for a, b in zip(off["replies"], on["replies"]))
        rows.append(f"| {agent} | {len(calls)} | {off['prompt']:,} | {off['prefilled']:,} | {on['prefilled']:,} | "
                    f"{off['seconds']:.0f} | {on['seconds']:.0f} | {off['seconds'] / on['seconds']:.2f}x | "
                    f"{same}/{len(calls)} |")
        print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
