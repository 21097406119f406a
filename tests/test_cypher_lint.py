"""Every Cypher statement passes Neo4j's official linter (scripts/lint_cypher.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.skipif(not (SCRIPTS / "node_modules").is_dir(), reason="run `npm ci` in scripts/ first")
def test_cypher_statements_lint_clean() -> None:
    done = subprocess.run([sys.executable, str(SCRIPTS / "lint_cypher.py")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith(" 0 diagnostics")
