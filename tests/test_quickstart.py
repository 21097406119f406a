"""The README's quickstart, as a newcomer runs it first: scripted `fake:` models and the hash embedder (no
download, no model), ingest -> search -> ask -> eval -> report, in a fresh folder, in seconds."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart() -> list[str]:
    """The commands of the README's quickstart block, as a newcomer pastes them."""
    text = README.read_text(encoding="utf-8").split("## Quickstart", 1)[1]
    return re.search(r"^```bash\n(.*?)^```", text, re.DOTALL | re.MULTILINE).group(1).strip().splitlines()


BIN = Path(sys.executable).parent


@pytest.mark.skipif(shutil.which("bash") is None or not (BIN / "mhqa").exists(),
                    reason="needs bash and the installed `mhqa` script")
def test_quickstart_runs_in_under_a_minute(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MHQA_STORE"}
    env |= {"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "COLUMNS": "200"}
    script = tmp_path / "quickstart.sh"
    script.write_text("set -euo pipefail\n" + "\n".join(quickstart()) + "\n", encoding="utf-8")
    started = time.monotonic()
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert elapsed < 60, f"the quickstart took {elapsed:.0f} s"
    assert "passages added: 1" in done.stdout
    assert "Inception (p1)" in done.stdout  # the search hit
    assert "\nChristopher Nolan\n" in done.stdout  # ask's answer
    assert "2 runs on the 1 questions they share" in done.stdout
    assert json.loads((tmp_path / "runs" / "rag" / "summary.json").read_text())["f1"] == 1.0
    assert json.loads((tmp_path / "runs" / "direct" / "summary.json").read_text())["f1"] == 0.0
    assert (tmp_path / "quickstart-store" / "store.sqlite").is_file()
    assert "Traceback" not in done.stderr
