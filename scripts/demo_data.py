"""Write the demo's bundled sample (mhqa_graph/demo_data/) from the full benchmark files, by its fixed rule:

- hotpotqa/demo.jsonl: the first 30 rows of HotpotQA `dev_a.jsonl`, unchanged (their 10 paragraphs each);
- 2wikimultihopqa/demo_evidences.json: the first 40 rows of 2WikiMultihopQA `dev_evidences.json` that are
  compositional and walkable (each evidence subject is named in the question or is an earlier evidence's object),
  unchanged, one row a line.

    python scripts/demo_data.py [DATA]      # DATA: the benchmark data folder, default ../shared/data
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mhqa_graph.parsing import words

OUT = Path(__file__).resolve().parents[1] / "mhqa_graph" / "demo_data"
HOTPOT_ROWS, WIKI_ROWS = 30, 40


def walkable(row: dict) -> bool:
    """A compositional row whose evidence chain starts from entities the question names, in the graph's names."""
    if row.get("type") != "compositional" or not row.get("evidences"):
        return False
    question, seen = f" {words(row['question'])} ", set()
    for subject, _, obj in row["evidences"]:
        if subject not in seen and f" {words(subject)} " not in question:
            return False
        seen |= {subject, obj}
    return True


def main(data: Path) -> None:
    lines = (data / "hotpotqa" / "dev_a.jsonl").read_text(encoding="utf-8").splitlines()[:HOTPOT_ROWS]
    (OUT / "hotpotqa" / "demo.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = json.loads((data / "2wikimultihopqa" / "dev_evidences.json").read_text(encoding="utf-8"))
    chosen = [row for row in rows if walkable(row)][:WIKI_ROWS]
    text = "[\n" + ",\n".join(json.dumps(row, ensure_ascii=False) for row in chosen) + "\n]\n"
    (OUT / "2wikimultihopqa" / "demo_evidences.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data"))
