"""Evaluation: benchmark scoring, the concurrent resumable runner, and run reports.

    from mhqa_graph.eval import run_eval
    summary = run_eval("rag", "hotpotqa", "dev_a.jsonl", llm="qwen2.5-coder-1.5b", store_uri=None,
                       out_dir="runs/rag", limit=50, concurrency=4)
"""

from .environments import environment_name, prepare
from .report import Summary, compare, compare_table, plot, read_records, summarize, summary_table
from .runner import make_record, run_eval
from .scoring import exact_match, f1_score, score

__all__ = [
    "Summary", "compare", "compare_table", "environment_name", "exact_match", "f1_score", "make_record", "plot",
    "prepare", "read_records", "run_eval", "score", "summarize", "summary_table",
]
