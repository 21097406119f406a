"""The floors of the layout (README, "Layout"): `mhqa_graph/` (the core) imports nothing from `graphs/` or
`training/` at load time, `graphs/` nothing from `training/`; an import inside a function is allowed (it runs
when that function does). The guard layer (`graphs/guards/`) stands below the designs: of the project it imports
only `graphs/settings.py` and the errors, anywhere in it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UPPER = {"mhqa_graph": ("mhqa_graph.graphs", "mhqa_graph.training"), "graphs": ("mhqa_graph.training",)}
GUARD_LAYER = ROOT / "graphs" / "guards"
GUARD_LAYER_IMPORTS = ("mhqa_graph.graphs.guards", "mhqa_graph.graphs.settings", "mhqa_graph.errors")


def package_of(path: Path) -> str:
    """The dotted package a source file belongs to, as installed (graphs/ -> mhqa_graph.graphs)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
    if parts[0] in ("graphs", "training"):
        parts = ["mhqa_graph", *parts]
    return ".".join(parts[:-1] if rel.name != "__init__" else parts)


def imported(node: ast.Import | ast.ImportFrom, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of each name an import statement of `package` imports."""
    if isinstance(node, ast.Import):
        return [(node.lineno, a.name) for a in node.names]
    base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
    module = ".".join([*base, node.module] if node.module else base)
    return [(node.lineno, f"{module}.{a.name}") for a in node.names]


def load_time_imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of each import run when the module loads: module level, not in a function (nor
    under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package, found = package_of(path), []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.extend(imported(node, package))
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit([*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                       *[s for h in getattr(node, "handlers", []) for s in h.body]])

    visit(tree.body)
    return found


def upward(floor: str) -> list[str]:
    out = []
    for path in sorted((ROOT / floor).rglob("*.py")):
        for line, module in load_time_imports(path):
            if any(module == u or module.startswith(u + ".") for u in UPPER[floor]):
                out.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return out


def every_import(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of each import anywhere in a source file: in functions and under TYPE_CHECKING too."""
    package = package_of(path)
    return [found for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.Import, ast.ImportFrom)) for found in imported(node, package)]


@pytest.mark.parametrize("floor", list(UPPER))
def test_no_import_runs_upward_at_load_time(floor):
    assert upward(floor) == []


def test_the_guard_layer_imports_only_the_settings():
    """`graphs/guards/` (the registry, switches and verbs of the guards) imports no design, model call, tool or store,
    even inside a function: of the project, only `graphs/settings.py` and `mhqa_graph.errors`."""
    found = [f"{path.relative_to(ROOT)}:{line} imports {module}" for path in sorted(GUARD_LAYER.rglob("*.py"))
             for line, module in every_import(path) if module.startswith("mhqa_graph")
             and not any(module == m or module.startswith(m + ".") for m in GUARD_LAYER_IMPORTS)]
    assert found == []


def test_the_core_loads_without_the_designs():
    """Every core module imports with `mhqa_graph.graphs` and `mhqa_graph.training` unimportable."""
    modules = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                     for p in (ROOT / "mhqa_graph").rglob("*.py") if "testing" not in p.parts and p.name != "cli.py"
                     and p.stem not in ("studio", "demo"))
    script = ("import sys, importlib\n"
              "class Block:\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name.startswith(('mhqa_graph.graphs', 'mhqa_graph.training')):\n"
              "            raise ImportError('upward: ' + name)\n"
              "sys.meta_path.insert(0, Block())\n"
              f"for m in {modules!r}:\n"
              "    importlib.import_module(m)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_loading_the_designs_loads_no_evaluation_module():
    """Importing the registry (`mhqa_graph.graphs`, every design's spec with it) and building each agent's graph
    loads no `mhqa_graph.eval` module: the evaluator is not loaded with the agents. A failure names the evaluation
    modules loaded."""
    script = ("import sys\n"
              "from mhqa_graph.graphs import SPECS\n"
              "for spec in SPECS.values():\n"
              "    spec.build()\n"
              "loaded = sorted(m for m in sys.modules if m.startswith('mhqa_graph.eval'))\n"
              "sys.exit(f'evaluation modules loaded: {loaded}' if loaded else 0)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
