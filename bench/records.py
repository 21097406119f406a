"""The benchmark's per-question records, compact and committed: `bench/results/<llm>/<env>/<variant>.jsonl.gz`
(`mhqa_graph.eval.records`: what each record holds). `save` merges a run folder's records into its file, so a
benchmark stopped on one machine goes on from the committed files on another: `bench/agents.py` asks only the
questions they lack.
"""

from __future__ import annotations

import re
from pathlib import Path

from mhqa_graph.eval.records import SUFFIX, compact, load, save, write  # noqa: F401  (read here by bench/ and its tests)

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def path_of(llm: str, env: str, variant: str, root: Path = RESULTS_DIR) -> Path:
    """The records file of one (model, environment, variant): the variant as named (`omne:guards=none`)."""
    return root / re.sub(r"[^\w.-]+", "_", llm) / env / (re.sub(r"[^\w.=;,:+-]+", "_", variant) + SUFFIX)


def variants(llm: str, env: str, root: Path = RESULTS_DIR) -> dict[str, Path]:
    """variant -> records file, for the files of one (model, environment)."""
    folder = path_of(llm, env, "x", root).parent
    return {p.name[:-len(SUFFIX)]: p for p in sorted(folder.glob("*" + SUFFIX))}
