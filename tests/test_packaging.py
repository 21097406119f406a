"""The installed package: imports from outside the repo, wheel layout, no heavy imports at start-up."""

from __future__ import annotations

import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORTS = ("import mhqa_graph, mhqa_graph.graphs, mhqa_graph.training, mhqa_graph.store.embedded; "
           "print(mhqa_graph.__file__)")


def _run(python: str, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_installed_imports_work_outside_the_repo(tmp_path):
    done = _run(sys.executable, IMPORTS, tmp_path)
    assert done.returncode == 0, done.stderr
    for generic in ("graphs", "training"):
        assert _run(sys.executable, f"import {generic}", tmp_path).returncode != 0, f"{generic} is importable"


THIRD_PARTY = ("numpy", "pydantic", "httpx", "langchain_core", "langgraph", "langgraph_sdk", "openai",
               "langchain_openai", "neo4j", "faiss", "starlette", "typer", "rich", "pytest", "torch",
               "transformers", "datasets", "peft", "trl")  # those an extra leaves out are skipped


def test_every_module_imports_first_in_a_fresh_interpreter(tmp_path):
    """An import cycle shows only when its module is the first one imported."""
    modules = sorted(f"mhqa_graph.{p.relative_to(ROOT / 'mhqa_graph').with_suffix('').as_posix().replace('/', '.')}"
                     for p in (ROOT / "mhqa_graph").rglob("*.py") if p.name != "__init__.py")
    modules += [f"mhqa_graph.{d}.{p.stem}" for d in ("graphs", "training") for p in sorted((ROOT / d).glob("*.py"))
                if p.name != "__init__.py"]
    # The third-party libraries are imported once; each project module is then imported first in a fork of that
    # interpreter, where no project module is loaded yet (a cycle is among the project's own modules).
    code = ("import importlib, os, sys\n"
            f"for dep in {THIRD_PARTY!r}:\n"
            "    try:\n"
            "        importlib.import_module(dep)\n"
            "    except ImportError:\n"
            "        pass\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'mhqa_graph'], 'a library imported mhqa_graph'\n"
            f"for m in {modules!r}:\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        try:\n"
            "            importlib.import_module(m)\n"
            "        except BaseException as exc:\n"
            "            print(m, type(exc).__name__, exc, flush=True)\n"
            "            os._exit(1)\n"
            "        os._exit(0)\n"
            "    if os.waitpid(pid, 0)[1]: print(m, 'failed', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and not done.stdout, done.stdout + done.stderr


def test_core_import_does_not_load_torch(tmp_path):
    code = "import sys, mhqa_graph, mhqa_graph.cli, mhqa_graph.store.embedded; print('torch' in sys.modules)"
    done = _run(sys.executable, code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_wheel_puts_only_mhqa_graph_in_site_packages(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, timeout=300)
    wheel = next(tmp_path.glob("mhqa_graph-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"mhqa_graph"}
    assert "mhqa_graph/graphs/__init__.py" in names and "mhqa_graph/training/__init__.py" in names
    for data in ("demo_data/README.md", "demo_data/hotpotqa/demo.jsonl", "demo_data/2wikimultihopqa/LICENSE",
                 "demo_data/2wikimultihopqa/demo_evidences.json", "adapters/omne-pq2h/README.md"):
        assert f"mhqa_graph/{data}" in names, data  # an installed package runs the demo and has the model card

    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = str(env / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300)
    # Borrow the dependencies of the test environment rather than installing them twice.
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    done = _run(python, IMPORTS, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(purelib), done.stdout
