"""Every command block of README.md runs as written, with scripted `fake:` models where it needs a model.

The commands run in a scratch folder beside a link to the benchmark data (`../shared/data`, as the
README assumes), with `MHQA_STORE` at a hash-embedder store holding what the demo builds. Each README
command must have an entry in BASH or PYTHON below: how it runs, or why it is skipped (it needs a
real model, a network, a server or minutes of CPU). A command added to the README without an entry
fails `test_every_readme_command_is_covered`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mhqa_graph.demo import BUNDLED, HOTPOT, KG
from mhqa_graph.eval.environments import environment_name
from mhqa_graph.ingest.runner import ingest_dataset
from mhqa_graph.store import open_store

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide.md"  # the README's reference part: its commands are held to the same rule

OPERA = 'fake:["{\\"subgoals\\": [\\"Who?\\"], \\"sufficient\\": true, \\"answer\\": \\"Tulsa\\"}"]'  # every role
RAG = 'fake:["<answer>Tulsa</answer>"]'
OMNE = 'fake:["<answer>Grammy</answer>"]'
TRIPLES = 'fake:["Sony | founded by | Masaru Ibuka"]'

# a README command, as shlex splits it -> ("run", extra args, --llm replacement) or ("skip", why)
RUN, SKIP = "run", "skip"
BASH: dict[str, tuple] = {
    "bash scripts/demo.sh": (SKIP, "installs the Qwen packs and runs a real model (the lead runs it; its code path: "
                                   "test_cli.py::test_demo_with_a_fake_model)"),
    "bash scripts/test.sh": (SKIP, "installs every extra and runs this very suite"),
    "mhqa ask 'The band who released the debut album \"Tinted Windows\" had their first performance in what city?' "
    "--agent opera --corpus hotpotqa-demo --stream": (RUN, ["--llm", OPERA], None),
    "mhqa ask \"What is the award that the performer of song Sunday Papers earned?\" --agent auto "
    "--graph 2wiki-demo_evidences --json": (RUN, ["--llm", OMNE], None),
    "bash scripts/install.sh models,studio && . .venv/bin/activate": (SKIP, "installs packages (network)"),
    "export MHQA_STORE=embedded://$PWD/.mhqa-demo": (SKIP, "sets the variable every command here runs with"),
    "LANGGRAPH_CLI_NO_ANALYTICS=1 LANGGRAPH_NO_VERSION_CHECK=1 langgraph dev --host 127.0.0.1 --port 2024 "
    "--no-browser": (SKIP, "a server on a fixed port; test_studio.py starts it on a free one"),
    "mhqa eval ../shared/data/hotpotqa/dev_a.jsonl --dataset hotpotqa --agent rag --llm llamacpp:qwen2.5-coder-1.5b "
    "--limit 50 --concurrency 4 --out runs/rag-hp-a": (RUN, [], RAG),
    "mhqa eval ../shared/data/hotpotqa/dev_a.jsonl --dataset hotpotqa --agent opera --llm "
    "llamacpp:qwen2.5-coder-1.5b --limit 50 --out runs/opera-hp-a": (RUN, [], OPERA),
    "mhqa report runs/rag-hp-a runs/opera-hp-a --out runs/compare.png": (RUN, [], None),
    "mhqa export runs/opera-hp-a --format sft --out data/opera-sft --min-reward 0.5": (RUN, [], None),
    "mhqa train mygo --config configs/train/mygo.yaml": (SKIP, "trains a real model (test_mygo.py runs a tiny one)"),
    "mhqa train mapgrpo --config configs/train/mapgrpo.yaml": (SKIP, "trains a real model (test_mapgrpo.py)"),
    "mhqa train omne --config configs/train/omne.yaml": (SKIP, "trains a real model (test_omne_training.py)"),
    "python bench/learn.py": (SKIP, "a real LoRA run of an hour"),
    "mhqa ingest dataset hotpotqa ../shared/data/hotpotqa/dev_a.jsonl --name hotpotqa-dev_a": (RUN, [], None),
    "mhqa ingest dataset 2wiki ../shared/data/2wikimultihopqa/dev_evidences.json --name 2wiki-dev_evidences":
        (RUN, [], None),
    "mhqa ingest dataset pathquestion ../shared/data/pathquestion/2H-kb.txt --name pq2h": (RUN, [], None),
    "mhqa ingest triples kg.tsv --graph mykg": (RUN, [], None),
    "mhqa ingest passages docs.jsonl --corpus mydocs": (RUN, [], None),
    "mhqa ingest plans ../shared/data/2wikimultihopqa/train_context.json --corpus plans": (RUN, [], None),
    "mhqa ingest extract --corpus mydocs --graph mydocs-kg --llm qwen2.5-coder-1.5b --limit 100": (RUN, [], TRIPLES),
    "mhqa stats": (RUN, [], None),
    'mhqa query match 2wiki-dev_evidences "duke louis of wurttemberg" -k 5': (RUN, [], None),
    'mhqa query node 2wiki-dev_evidences "Duke Louis of Württemberg" --json': (RUN, [], None),
    'mhqa query search hotpotqa-dev_a "Tinted Windows first performance" --mode hybrid -k 3': (RUN, [], None),
    "python bench/store.py": (SKIP, "a benchmark of minutes (200k entities)"),
    "python bench/retrieval.py hotpotqa ../shared/data/hotpotqa/dev_a.jsonl": (SKIP, "a benchmark with the real "
                                                                                      "embedding model"),
    "python bench/fanout.py": (SKIP, "a timing benchmark"),
    "python bench/eval_throughput.py": (SKIP, "a timing benchmark"),
    "python bench/soak.py": (SKIP, "1,000 questions: minutes of CPU"),
    "python bench/agents.py --quick": (SKIP, "runs the real 1.5B model for about 20 minutes"),
    "python bench/agents.py --start 140 --limit 40 --agents rag,auto": (SKIP, "runs the real 1.5B model for hours"),
    'python3.11 -m venv .venv && .venv/bin/pip install -e ".[light]" && . .venv/bin/activate':
        (SKIP, "installs packages (network); test_quickstart.py runs the quickstart from this install"),
    "python bench/serving.py": (SKIP, "runs the real 1.5B model (test_prefix_cache.py runs a tiny one)"),
    "python bench/serving.py --runs bench/out/runs/llamacpp_qwen2.5-coder-1.5b/pq2h": (SKIP, "reads benchmark run "
                                                                                       "folders; "
                                                                                       "test_bench_serving.py "
                                                                                       "tests it"),
    "python bench/serving.py --eval pq2h,hotpot --limit 6": (SKIP, "runs the real 1.5B model twice side by side "
                                                                  "for 26 min; test_bench_serving.py tests its table"),
    "python bench/probes.py": (SKIP, "a minute of probes; test_store_recovery.py and test_eval_robustness.py "
                                     "test each defect they probe"),
}

# a README python block, by its first line -> ("run", {text: replacement}) or ("skip", why)
PYTHON: dict[str, tuple] = {
    "from mhqa_graph.graphs import build_graph, make_context, as_tool": (RUN, {}),
    "from mhqa_graph.graphs import build_graph, make_context": (RUN, {}),  # a pytest test: run by pytest
    "from mhqa_graph.traces import TraceRecorder": (RUN, {}),  # runs after the first block, which makes `context`
    "from mhqa_graph import open_store, Passage": (RUN, {}),
    "from mhqa_graph.models.factory import load_chat_model": (SKIP, "loads real models and servers "
                                                                    "(test_models.py covers each spec kind)"),
    "from langchain.agents import create_agent": (SKIP, "needs langchain (not a dependency) and a hosted model; its "
                                                        "tools are as_tool's and make_tools' (test_graph_structure.py, "
                                                        "test_injection.py)"),
}


def blocks(language: str) -> list[str]:
    text = README.read_text(encoding="utf-8") + "\n" + GUIDE.read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.DOTALL | re.MULTILINE)


def bash_commands() -> list[str]:
    """Each command of the bash blocks, continuation lines joined and comments dropped, as one string."""
    commands = []
    for block in blocks("bash"):
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command, comments=True)
            if words:
                commands.append(" ".join(shlex.quote(w) if w != "&&" else w for w in words))
    return commands


def key(command: str) -> str:
    return " ".join(shlex.quote(w) if w != "&&" else w for w in shlex.split(command, comments=True))


def test_every_readme_command_is_covered():
    from test_quickstart import quickstart

    covered = {key(c) for c in BASH} | {key(c) for c in quickstart()}  # test_quickstart.py runs those in order
    assert [c for c in bash_commands() if c not in covered] == []
    assert {block.splitlines()[0] for block in blocks("python")} == set(PYTHON)
    assert len(BASH) + len(quickstart()) == len(set(bash_commands()))  # no entry for a command the README dropped


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, data_dir) -> tuple[Path, dict[str, str], str]:
    """A scratch folder beside `shared/data` (a link to the benchmark data), the files the README
    ingests, and MHQA_STORE at a hash-embedder store; (folder, environment, store URI)."""
    root = tmp_path_factory.mktemp("readme")
    (root / "shared").mkdir()
    (root / "shared" / "data").symlink_to(data_dir)
    work = root / "work"
    work.mkdir()
    (work / "kg.tsv").write_text("Polish-Russian War\tdirector\tXawery Żuławski\n", encoding="utf-8")
    (work / "docs.jsonl").write_text(json.dumps({"id": "sony", "title": "Sony",
                                                 "text": "Sony was founded by Masaru Ibuka."}) + "\n")
    uri = f"embedded://{root / 'store'}?embedder=hash"
    with open_store(uri) as store:  # what the demo builds (the README's ingest commands then add nothing)
        for dataset, path in ((HOTPOT[0], data_dir / HOTPOT[1]), (KG[0], data_dir / KG[1]), *BUNDLED):
            ingest_dataset(store, dataset, path, environment_name(dataset, path))
    env = {**os.environ, "MHQA_STORE": uri, "COLUMNS": "200"}
    return work, env, uri


def mhqa(args: list[str], work: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mhqa_graph.cli", *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)


def test_readme_bash_commands_run(workdir):
    """In README order, after the ingest commands (which build what the demo builds)."""
    work, env, _ = workdir
    commands = [c for c in BASH if BASH[c][0] == RUN]
    ingest = [c for c in commands if c.startswith("mhqa ingest")]
    for command in ingest + [c for c in commands if c not in ingest]:
        _, extra, llm = BASH[command]
        words = shlex.split(command, comments=True)[1:]
        if llm is not None:
            words[words.index("--llm") + 1] = llm
        done = mhqa([*words, *extra], work, env)
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr, command
    assert (work / "runs" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert (work / "data" / "opera-sft" / "sft.jsonl").is_file()
    assert "mydocs-kg" in mhqa(["stats"], work, env).stdout


def test_readme_python_blocks_run(workdir, tmp_path):
    work, env, uri = workdir
    py = {block.splitlines()[0]: block for block in blocks("python")}
    agents = py["from mhqa_graph.graphs import build_graph, make_context, as_tool"]
    agents = agents.replace('"llamacpp:qwen2.5-coder-1.5b"', repr('fake:["{\\"answer\\": \\"Tulsa\\"}"]'))
    agents = agents.replace("embedded:///data/kb", uri)
    script = agents + "\n" + py["from mhqa_graph.traces import TraceRecorder"].replace(
        'build_graph("opera")', 'build_graph("mujica")').replace('TraceRecorder("opera"', 'TraceRecorder("mujica"')
    script += '\nassert trace.llm_calls[0].role == "planner" and trace.answer == "Tulsa", trace\n'
    done = subprocess.run([sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    store = py["from mhqa_graph import open_store, Passage"].replace(
        "embedded:///data/kb", f"embedded://{tmp_path / 'kb'}?embedder=hash")
    done = subprocess.run([sys.executable, "-c", store], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    test_file = tmp_path / "test_readme_example.py"
    test_file.write_text(py["from mhqa_graph.graphs import build_graph, make_context"], encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:]
