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
    """The commands of the README's quickstart block (the one after the install line), as a newcomer pastes them."""
    text = README.read_text(encoding="utf-8").split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    return next(b for b in blocks if "mhqa ingest" in b).strip().splitlines()


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


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_quickstart_from_the_light_install(tmp_path):
    """The quickstart from `pip install -e ".[light]"` alone (no torch, no llama.cpp), then an export."""
    root = README.parent
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-e", f"{root}[light]"],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ("MHQA_STORE", "VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "COLUMNS": "200"}
    script = tmp_path / "quickstart.sh"
    script.write_text("set -euo pipefail\n" + "\n".join(quickstart()) +
                      "\nmhqa export runs/rag --format sft --out ds\n"
                      "python -c 'import importlib.util as u; assert u.find_spec(\"torch\") is None'\n",
                      encoding="utf-8")
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "\nChristopher Nolan\n" in done.stdout and "sft: 1 rows" in done.stdout
