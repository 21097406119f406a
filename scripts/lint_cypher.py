"""Lint every Cypher statement of the project with Neo4j's official linter.

Statements: `mhqa_graph.store.cypher.ALL_STATEMENTS` and each statement of neo4j/schema.cypher.
Needs node and `npm ci` in scripts/. Exit status: 0 when there are no diagnostics.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
sys.path.insert(0, str(ROOT))

from mhqa_graph.store.cypher import ALL_STATEMENTS  # noqa: E402


def schema_statements(path: Path = ROOT / "neo4j" / "schema.cypher") -> dict[str, str]:
    """The `;`-separated statements of a Cypher script, without `//` comment lines."""
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("//"))
    parts = [p.strip() for p in re.split(r";\s*(?:\n|$)", text)]
    return {f"schema.cypher#{i}": p for i, p in enumerate((p for p in parts if p), start=1)}


def main() -> int:
    statements = {**ALL_STATEMENTS, **schema_statements()}
    done = subprocess.run(["node", str(SCRIPTS / "lint_cypher.mjs")], input=json.dumps(statements), text=True)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
