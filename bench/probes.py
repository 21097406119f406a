"""Reliability probes: each row tries one way a user can hurt the store or an evaluation, with fake models
and the hash embedder, and counts the tries that failed. SECURITY.md holds the table this prints.

    python bench/probes.py [--only NAME ...]

A try fails when the command shows a traceback, loses or duplicates a record, answers wrongly, leaks
file handles, or says something false (a store called corrupt that is intact, advice to delete it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.calls import get_store

from mhqa_graph import Passage, open_store
from mhqa_graph.store.embedded import POOL_SIZE, EmbeddedStore
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.traces import run_with_trace

SURROGATE_REPLY = 'fake:["<answer>Tulsa \\ud800</answer>"]'
AGENTS = ("rag", "direct", "opera", "mujica", "omne")
DEEP = "[" * 100_000 + "]" * 100_000
Result = tuple[int, int, str]


def mhqa(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mhqa_graph.cli", *args], capture_output=True, text=True,
                          timeout=timeout, errors="replace")


def broken(done: subprocess.CompletedProcess) -> bool:
    """A traceback, an untyped exit, or advice to delete a store."""
    return "Traceback" in done.stderr or done.returncode not in (0, 2) or "delete the directory" in done.stderr


def hotpot_file(path: Path, questions: list[str]) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for i, q in enumerate(questions):
            title = f"Page {i}"
            f.write(json.dumps({"id": f"q{i}", "question": q, "answer": "Tulsa", "type": "bridge", "level": "easy",
                                "supporting_facts": {"title": [title], "sent_id": [0]},
                                "context": {"title": [title], "sentences": [[f"{title} is about Tulsa."]]}}) + "\n")
    return path


def passages(n: int, start: int = 0) -> list[Passage]:
    return [Passage(f"p{i}", f"Title {i}", f"Passage number {i} tells of town {i} in county {i % 13}.")
            for i in range(start, start + n)]


def triples(n: int, start: int = 0) -> list[tuple[str, str, str]]:
    return [(f"person {i}", "born in", f"town {i % 50}") for i in range(start, start + n)]


def uri(path: Path) -> str:
    return f"embedded://{path}?embedder=hash"


def results(out: Path) -> list[str]:
    path = out / "results.jsonl"
    return [json.loads(line)["id"] for line in path.read_text().splitlines()] if path.exists() else []


# -- the probes ----------------------------------------------------------------------------
def surrogate_eval(tmp: Path) -> Result:
    """A question holding "\\ud800" and a model reply holding one: every agent records all 3 questions."""
    data = hotpot_file(tmp / "q.jsonl", ["Which city did Alpha play in \ud800?", "Who founded Gamma?", "Where?"])
    failures, recorded = 0, 0
    for agent in AGENTS:
        out = tmp / f"run-{agent}"
        done = mhqa("eval", str(data), "--dataset", "hotpotqa", "--agent", agent, "--llm", SURROGATE_REPLY,
                    "--store", uri(tmp / "s"), "--out", str(out))
        ids = results(out)
        recorded += len(ids)
        failures += broken(done) or done.returncode != 0 or sorted(ids) != ["q0", "q1", "q2"]
    return len(AGENTS), failures, f"{recorded}/{3 * len(AGENTS)} records"


def surrogate_ask(tmp: Path) -> Result:
    """`mhqa ask` with a reply holding a lone surrogate, and non-string topic_entities in Python."""
    failures = broken(mhqa("ask", "Where is Alpha?", "--agent", "direct", "--llm", SURROGATE_REPLY))
    with open_store(uri(tmp / "s")) as store:
        store.add_triples("kg", triples(20))
    code = textwrap.dedent(f"""
        from mhqa_graph.graphs import build_graph, make_context
        from mhqa_graph.traces import run_with_trace
        for agent in {AGENTS!r}:
            ctx = make_context(agent, llm={SURROGATE_REPLY!r}, store={uri(tmp / "s")!r},
                               graph=None if agent == "direct" else "kg")
            output, trace = run_with_trace(build_graph(agent), agent, "Where was person 3 born?", ctx,
                                           topic_entities=[3, None, "person 3"])
            print(agent, trace.model_dump_json()[:0])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    bad = sum(agent not in done.stdout.split() for agent in AGENTS)
    return 1 + len(AGENTS), failures + bad, f"{failures + bad} crashes"


def fill_pool(store: EmbeddedStore) -> None:
    """Lend the store's pool POOL_SIZE connections at once, each reading, and take them back: it then keeps as
    many idle connections (and their open files) as it ever will."""
    with ExitStack() as lent:
        for _ in range(POOL_SIZE):
            lent.enter_context(store._sqlite.lend()).execute("SELECT count(*) FROM passages").fetchone()


def handles(tmp: Path) -> Result:
    """rag and mujica questions in one process, 40 from each of 5 fresh pools of 8 threads (the store stays open,
    as the agents' store does): open files after each pool. The store's connection pool is full before the first,
    so open files that grow are a leak, not the pool filling to its bound."""
    with open_store(uri(tmp / "s")) as store:
        store.add_passages("docs", passages(200))
    model = FakeChatModel(responses=['{"answer": "Tulsa"}', "<answer>Tulsa</answer>"])
    runs = [(build_graph(agent), make_context(agent, llm=model, store=uri(tmp / "s"), corpus="docs"))
            for agent in ("rag", "mujica")]
    store = get_store(runs[0][1])  # the agents' store: one per URI in a process
    assert isinstance(store, EmbeddedStore) and all(get_store(c) is store for _, c in runs)
    fill_pool(store)
    counts = []
    for round_ in range(5):
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: [g.invoke({"question": f"Where is town {i}?"}, context=c) for g, c in runs],
                          range(round_ * 40, round_ * 40 + 40)))
        counts.append(len(os.listdir("/proc/self/fd")))
    grew = [b - a for a, b in zip(counts, counts[1:])]
    return len(grew), sum(g > 0 for g in grew), f"+{counts[-1] - counts[0]} open files over 4 pools"


WRITER = textwrap.dedent("""
    import sys, time
    from mhqa_graph import Passage, open_store
    with open_store(sys.argv[1]) as store:
        for i in range(100000):
            store.add_passages("docs", [Passage(f"w{i}-{j}", "T", f"written {i} {j}") for j in range(50)])
            store.add_triples("kg", [(f"w{i}", "r", f"x{i}")])
            print("batch", flush=True)
            time.sleep(0.05)
""")


def readers_during_ingest(tmp: Path) -> Result:
    """stats, query search, query node and a rag ask while another process ingests into the store."""
    with open_store(uri(tmp / "s")) as store:
        store.add_passages("docs", passages(50))
        store.add_triples("kg", triples(50))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, uri(tmp / "s")], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().startswith("batch")
    commands = [["stats"], ["query", "search", "docs", "town 3"], ["query", "node", "kg", "person 3"],
                ["ask", "Where?", "--agent", "rag", "--corpus", "docs", "--llm", 'fake:["<answer>x</answer>"]']]
    failures, tries, deletes = 0, 0, 0
    try:
        for _ in range(3):
            for command in commands:
                done = mhqa(*command, "--store", uri(tmp / "s"))
                tries += 1
                failures += done.returncode != 0 or broken(done)
                deletes += "delete" in done.stderr
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    return tries, failures, f"{failures} refused or failed, {deletes} advised deleting"


EVAL = textwrap.dedent("""
    import sys
    from mhqa_graph.eval import run_eval
    from mhqa_graph.testing.fakes import FakeChatModel
    run_eval("rag", "hotpotqa", sys.argv[1], None, sys.argv[2], sys.argv[3], concurrency=2, progress=False,
             context_overrides={"llm": FakeChatModel(responses=["<answer>Tulsa</answer>"], latency=0.1)})
""")


def two_evals_one_out(tmp: Path) -> Result:
    """Two evals started together into one --out: one runs, the other is refused; no question twice."""
    data = hotpot_file(tmp / "q.jsonl", [f"Question number {i}?" for i in range(20)])
    with open_store(uri(tmp / "s")) as store:  # the environment, built before
        from mhqa_graph.eval import environment_name, prepare

        prepare(store, "hotpotqa", data, environment_name("hotpotqa", data))
    failures, extra = 0, 0
    for attempt in range(2):
        out = tmp / f"run{attempt}"
        procs = [subprocess.Popen([sys.executable, "-c", EVAL, str(data), uri(tmp / "s"), str(out)],
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        codes = [p.wait(timeout=120) for p in procs]
        ids = results(out)
        extra += len(ids) - len(set(ids))
        failures += len(ids) != len(set(ids)) or sorted(codes)[0] != 0 or sorted(codes)[1] == 0
    return 2, failures, f"{extra} questions run twice"


def damaged_sqlite(tmp: Path) -> Result:
    """Pages in the middle of store.sqlite overwritten: stats, query and ingest give one typed line."""
    with open_store(uri(tmp / "s")) as store:
        store.add_passages("docs", passages(3000))
    db = tmp / "s" / "store.sqlite"
    size = db.stat().st_size
    with db.open("r+b") as f:
        f.seek(size // 3)
        f.write(os.urandom(size // 3))
    rows = tmp / "p.jsonl"
    rows.write_text(json.dumps({"id": "n1", "title": "New", "text": "A new passage."}) + "\n")
    commands = [["stats"], ["query", "search", "docs", "town 3"], ["ingest", "passages", str(rows), "--corpus", "docs"]]
    bad = [c[0] for c in commands if broken(mhqa(*c, "--store", uri(tmp / "s")))]
    return len(commands), len(bad), f"tracebacks: {', '.join(bad) or 'none'}"


def indexes_ahead(tmp: Path) -> Result:
    """SQLite loses its last commits (store.sqlite restored from before them); the next ingest's new subject
    and passage must be found by node_info and dense search."""
    root = tmp / "s"
    with open_store(uri(root)) as store:
        store.add_triples("kg", triples(100))
        store.add_passages("docs", passages(100))
    shutil.copy(root / "store.sqlite", tmp / "before.sqlite")
    with open_store(uri(root)) as store:
        store.add_triples("kg", triples(100, start=100))
        store.add_passages("docs", passages(100, start=100))
    shutil.copy(tmp / "before.sqlite", root / "store.sqlite")
    for wal in root.glob("store.sqlite-*"):
        wal.unlink()
    failures = 0
    with open_store(uri(root)) as store:
        store.add_triples("kg", [("zelda newcomer", "lives in", "hyrule")])
        store.add_passages("docs", [Passage("fresh", "Fresh", "A fresh passage about quokkas and wombats.")])
        try:
            failures += not store.node_info("kg", "zelda newcomer").facts
        except Exception:
            failures += 1
        try:
            hits = store.search("docs", "A fresh passage about quokkas and wombats.", k=1, mode="dense")
            failures += not hits or hits[0].id != "fresh"
        except Exception:
            failures += 1
    return 2, failures, f"{failures} of node_info and dense search missed the new rows"


def nested_json(tmp: Path) -> Result:
    """A row nested 100,000 deep in passage, triple, dataset and question files, with and without --skip-bad."""
    good = json.dumps({"id": "a", "title": "A", "text": "Alpha."})
    (tmp / "p.jsonl").write_text(good + "\n" + DEEP + "\n")
    (tmp / "t.json").write_text("[" + DEEP + "]")
    data = hotpot_file(tmp / "q.jsonl", ["Where is Alpha?"])
    with data.open("a") as f:
        f.write(DEEP + "\n")
    store = ["--store", uri(tmp / "s")]
    commands = [["ingest", "passages", str(tmp / "p.jsonl"), "--corpus", "c"],
                ["ingest", "passages", str(tmp / "p.jsonl"), "--corpus", "c", "--skip-bad"],
                ["ingest", "triples", str(tmp / "t.json"), "--graph", "g", "--skip-bad"],
                ["ingest", "dataset", "hotpotqa", str(data), "--skip-bad"],
                ["eval", str(data), "--dataset", "hotpotqa", "--agent", "direct",
                 "--llm", 'fake:["<answer>a</answer>"]', "--out", str(tmp / "run")]]
    bad = sum(broken(mhqa(*c, *store)) for c in commands)
    return len(commands), bad, f"{bad} RecursionError tracebacks"


def vector_files(tmp: Path) -> Result:
    """An unreadable vector file opened read-only, and a faiss file with damaged vectors: the file is kept and
    dense search answers as before."""
    root = tmp / "s"
    with open_store(uri(root)) as store:
        store.add_passages("docs", passages(300))
        want = store.search("docs", "town 17", k=3, mode="dense")
    [vectors] = list((root / "vectors").glob("*.faiss"))
    good = vectors.read_bytes()
    failures = 0
    vectors.write_bytes(b"garbage")
    try:
        with open_store(uri(root), read_only=True) as store:
            failures += store.search("docs", "town 17", k=3, mode="dense") != want or not vectors.exists()
    except Exception:
        failures += 1
    for read_only in (True, False):
        damaged = bytearray(good)
        damaged[len(good) // 4:len(good) // 4 + 4096] = os.urandom(4096)  # inside the stored vectors
        vectors.write_bytes(bytes(damaged))
        try:
            with open_store(uri(root), read_only=read_only) as store:
                failures += store.search("docs", "town 17", k=3, mode="dense") != want
        except Exception:
            failures += 1
    return 3, failures, f"{failures} wrong or empty dense results"


TIMEOUT = textwrap.dedent("""
    import sys, time
    from mhqa_graph.eval import read_records, run_eval
    from mhqa_graph.testing.fakes import FakeChatModel
    start = time.monotonic()
    run_eval("direct", "hotpotqa", sys.argv[1], None, sys.argv[2], sys.argv[3], progress=False,
             context_overrides={"llm": FakeChatModel(latency=600), "model_timeout": 1.0, "model_retries": 0})
    timed_out = sum("model_timeout" in (r["error"] or "") for r in read_records(sys.argv[3] + "/results.jsonl"))
    print(timed_out, round(time.monotonic() - start))
""")


def model_timeout(tmp: Path) -> Result:
    """A model that stalls for 10 minutes, with a 1 s model_timeout: both questions recorded with the timeout."""
    data = hotpot_file(tmp / "q.jsonl", ["Where is Alpha?", "Where is Beta?"])
    try:
        done = subprocess.run([sys.executable, "-c", TIMEOUT, str(data), uri(tmp / "s"), str(tmp / "run")],
                              capture_output=True, text=True, timeout=60)
        ok = done.returncode == 0 and done.stdout.split()[0] == "2"
        figure = f"{done.stdout.split()[1]} s" if ok else done.stderr.strip().splitlines()[-1][:80]
    except subprocess.TimeoutExpired:
        ok, figure = False, "still running after 60 s"
    return 1, int(not ok), figure


BIG = "x" * 1_000_000


def topic_entities(tmp: Path) -> Result:
    """Each agent given a 1 MB topic entity and 100 more: no prompt longer than 20,000 characters, at most 20
    entities in the trace."""
    with open_store(uri(tmp / "s")) as store:
        store.add_triples("kg", triples(50))
    named = ["person 3", BIG, *(f"person {i}" for i in range(100))]
    agents = [a for a in AGENTS if a != "direct"]  # direct has no entities to use
    failures, longest = 0, 0
    for agent in agents:
        ctx = make_context(agent, llm=FakeChatModel(responses=["<answer>town 3</answer>"]), store=uri(tmp / "s"),
                           graph="kg")
        _, trace = run_with_trace(build_graph(agent), agent, "Where was person 3 born?", ctx, topic_entities=named)
        prompt = max((len(m.content) for c in trace.llm_calls for m in c.messages), default=0)
        longest = max(longest, prompt)
        failures += prompt > 20_000 or len(trace.topic_entities) > 20
    return len(agents), failures, f"longest prompt {longest:,} characters"


def trace_size(tmp: Path) -> Result:
    """Each agent with a model whose every reply is 1 MB: the trace keeps no text longer than 100,000 characters."""
    with open_store(uri(tmp / "s")) as store:
        store.add_passages("docs", passages(50))
    failures, largest = 0, 0
    for agent in AGENTS:
        ctx = make_context(agent, llm=FakeChatModel(responses=[BIG]), store=uri(tmp / "s"), corpus="docs")
        _, trace = run_with_trace(build_graph(agent), agent, "Where is town 3?", ctx)
        dumped = trace.model_dump_json()
        largest = max(largest, len(dumped))
        failures += BIG[:100_000] in dumped
    return len(AGENTS), failures, f"largest trace {largest / 1e6:.1f} MB"


def hub_node_info(tmp: Path) -> Result:
    """node_info of an entity with 200,000 facts, in a writer and in a reader: time and Python memory."""
    import tracemalloc

    with open_store(uri(tmp / "s")) as store:
        store.add_triples("kg", [t for r in range(100) for o in range(1000)  # 100,000 facts each way
                                 for t in [("hub", f"relation {r}", f"thing {o}"), (f"thing {o}", f"to {r}", "hub")]])
    failures, figures = 0, []
    for read_only in (False, True):
        with open_store(uri(tmp / "s"), read_only=read_only) as store:
            store.node_info("kg", "thing 0")  # the connection and its statements ready
            tracemalloc.start()
            started = time.perf_counter()
            store.node_info("kg", "hub")
            seconds = time.perf_counter() - started
            peak = tracemalloc.get_traced_memory()[1] / 1e6
            tracemalloc.stop()
        figures.append(f"{seconds:.2f} s, {peak:.0f} MB")
        failures += seconds > 1 or peak > 10
    return 2, failures, "; ".join(figures)


def ctrl_c(tmp: Path) -> Result:
    """SIGINT to `mhqa eval` with 16 questions in flight, 3 times: stderr says only what was interrupted (beside the
    ingest and progress lines), and the rerun finishes with each question once."""
    data = hotpot_file(tmp / "q.jsonl", [f"Where is town {i}?" for i in range(1500)])
    args = ["eval", str(data), "--dataset", "hotpotqa", "--agent", "rag", "--llm", 'fake:["<answer>Tulsa</answer>"]',
            "-k", "16", "--store", uri(tmp / "s")]
    failures, extra = 0, 0
    for attempt in range(3):
        out = tmp / f"run{attempt}"
        child = subprocess.Popen([sys.executable, "-m", "mhqa_graph.cli", *args, "--out", str(out)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while len(results(out)) < 800 and child.poll() is None:  # enough records that reading them collects
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=120)
        said = [line for line in stderr.splitlines() if not line.startswith(("ingest", "rag q.jsonl", "interrupted"))]
        extra += len(said)
        again = mhqa(*args, "--out", str(out))
        ids = results(out)
        failures += bool(said) or child.returncode != 130 or broken(again) or sorted(ids) != sorted(set(ids)) \
            or len(ids) != 1500
    return 3, failures, f"{extra} more stderr lines"


def store_path_chars(tmp: Path) -> Result:
    """Stores in folders named with URI characters: each keeps its database inside, readable by `mhqa stats`."""
    failures = 0
    names = ("st%231", "st%232", "q%3Fx", "e%41f", "p%25")
    for name in names:
        store = f"embedded://{tmp}/{name}?embedder=hash"
        rows = tmp / f"{name}.tsv"
        rows.write_text(f"a\tr\t{name}\n", encoding="utf-8")
        done = mhqa("ingest", "triples", str(rows), "--graph", "g", "--store", store)
        stats = mhqa("stats", "--store", store)
        failures += broken(done) or done.returncode != 0 or stats.returncode != 0 or "g" not in stats.stdout
    outside = [p.name for p in tmp.iterdir() if p.is_file() and not p.name.endswith(".tsv")]
    return len(names), failures + len(outside), f"{len(outside)} files outside the stores"


def long_integer(tmp: Path) -> Result:
    """A JSON integer of 5,000 digits and the number 1e400 in triple, passage and question files."""
    big = "9" * 5000
    files = {"triples": ('["a", "r", "b"]\n["x", "r", ' + big + ']\n["c", "r", 1e400]\n', ["--graph", "g"]),
             "passages": ('{"id": "p1", "title": "T", "text": "t"}\n{"id": ' + big + ', "title": "T", "text": "t"}\n',
                          ["--corpus", "c"])}
    failures, tries = 0, 0
    for kind, (text, extra) in files.items():
        path = tmp / f"{kind}.jsonl"
        path.write_text(text, encoding="utf-8")
        for skip in ([], ["--skip-bad"]):
            tries += 1
            done = mhqa("ingest", kind, str(path), *extra, "--store", uri(tmp / "s"), *skip)
            failures += broken(done) or (bool(skip) and done.returncode != 0)
    questions = hotpot_file(tmp / "qa.jsonl", ["Where?"])
    with questions.open("a", encoding="utf-8") as f:
        f.write('{"id": ' + big + ', "question": "x"}\n')
    done = mhqa("eval", str(questions), "--dataset", "hotpotqa", "--agent", "direct", "--llm",
                'fake:["<answer>Tulsa</answer>"]', "--store", uri(tmp / "e"), "--out", str(tmp / "run"))
    return tries + 1, failures + broken(done), "tracebacks" if failures else "one line each"


def torn_utf8_export(tmp: Path) -> Result:
    """`mhqa export` of a run whose last line was cut inside a CJK character, at three points."""
    record = {"id": "q1", "question": "東京は?", "answers": ["東京"], "prediction": "東京", "em": 1.0, "f1": 1.0,
              "trace": {"schema_version": 1, "agent": "rag", "question": "東京は?"}}
    line = json.dumps(record, ensure_ascii=False).encode("utf-8")
    failures = 0
    for cut in (1, 2):
        run = tmp / f"run{cut}"
        run.mkdir()
        (run / "results.jsonl").write_bytes(line + b"\n" + line[:line.index("東".encode()) + cut])
        done = mhqa("export", str(run), "--format", "sft", "--out", str(tmp / f"ds{cut}"))
        failures += broken(done)
    return 2, failures, f"{failures} tracebacks"


def planted_symlinks(tmp: Path) -> Result:
    """Symlinks planted in a run folder (results.jsonl, summary.json.tmp) to a file outside it."""
    questions = hotpot_file(tmp / "qa.jsonl", ["Where?"])
    target = tmp / "precious.txt"
    target.write_text("keep", encoding="utf-8")
    failures = 0
    for name in ("results.jsonl", "summary.json.tmp"):
        out = tmp / f"run-{name}"
        out.mkdir()
        (out / name).symlink_to(target)
        done = mhqa("eval", str(questions), "--dataset", "hotpotqa", "--agent", "direct", "--llm",
                    'fake:["<answer>Tulsa</answer>"]', "--store", uri(tmp / "s"), "--out", str(out))
        failures += broken(done) or target.read_text(encoding="utf-8") != "keep"
    return 2, failures, "target unchanged" if not failures else "target written"


def other_file_corpus(tmp: Path) -> Result:
    """`A/dev.jsonl` then `B/dev.jsonl` (same environment name) into one store; then A edited in place and its
    eval rerun: neither may exit 0 over the wrong corpus or records."""
    def questions(folder: str, answer: str) -> Path:
        (tmp / folder).mkdir()
        path = tmp / folder / "dev.jsonl"
        path.write_text(json.dumps({"id": "q1", "question": "Who?", "answer": answer, "context": {
            "title": [f"T {answer}"], "sentences": [[f"{answer} is it."]]}}) + "\n", encoding="utf-8")
        return path

    first, second = questions("A", "alpha"), questions("B", "beta")
    def run(path: Path, out: str) -> subprocess.CompletedProcess:
        return mhqa("eval", str(path), "--dataset", "hotpotqa", "--agent", "rag", "--llm",
                    'fake:["<answer>alpha</answer>"]', "--store", uri(tmp / "s"), "--out", str(tmp / out))

    ok = run(first, "ra")
    other = run(second, "rb")
    first.write_text(first.read_text(encoding="utf-8").replace("Who?", "Who is it?"), encoding="utf-8")
    edited = run(first, "ra")
    refused = [done.returncode != 0 and not broken(done) for done in (other, edited)]
    failures = (ok.returncode != 0) + refused.count(False)
    return 3, failures, "refused in one line" if not failures else "ran over the wrong corpus or records"


def key_separator(tmp: Path) -> Result:
    """Names holding U+001F (Neo4j's key separator) in a graph, an entity and a passage id, embedded store (the
    check is in the layer every backend shares)."""
    store = open_store(uri(tmp / "s"))
    failures = 0
    for call in (lambda: store.add_triples("g\u001fa", [("s", "r", "o")]),
                 lambda: store.add_triples("g", [("a\u001fb", "r", "o")]),
                 lambda: store.add_passages("c", [Passage("p\u001f1", "t", "x")])):
        try:
            call()
            failures += 1
        except Exception as exc:  # noqa: BLE001 - a probe counts any other outcome as a failure
            failures += type(exc).__name__ != "InvalidInput"
    store.close()
    return 3, failures, "refused (InvalidInput)" if not failures else "stored"


def disk_full(tmp: Path) -> Result:
    """ENOSPC on the third record of an eval with 4 questions in flight: one line, no pending task, a partial
    summary of the records written."""
    data = hotpot_file(tmp / "q.jsonl", [f"Where is town {i}?" for i in range(12)])
    script = tmp / "full.py"
    script.write_text(textwrap.dedent(f"""
        import errno
        from mhqa_graph.eval import run_eval
        from mhqa_graph.eval.runner import ResultsWriter
        from mhqa_graph.testing.fakes import FakeChatModel
        write, n = ResultsWriter.write, [0]
        def full(self, record):
            n[0] += 1
            if n[0] > 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            write(self, record)
        ResultsWriter.write = full
        try:
            run_eval("direct", "hotpotqa", {str(data)!r}, None, {uri(tmp / "s")!r}, {str(tmp / "run")!r},
                     concurrency=4, progress=False,
                     context_overrides={{"llm": FakeChatModel(responses=["<answer>Tulsa</answer>"], latency=0.05)}})
        except OSError as exc:
            print("stopped:", exc.strerror)
    """), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    summary = tmp / "run" / "summary.json"
    partial = summary.exists() and json.loads(summary.read_text(encoding="utf-8")).get("n") == 2
    failures = ("stopped: No space" not in done.stdout) + ("Task was destroyed" in done.stderr) + (not partial)
    return 3, failures, "partial summary, no pending task" if not failures else done.stderr[-200:]


def report_memory(tmp: Path) -> Result:
    """`mhqa report` of a 100,000-record run (3 kB traces) beside itself: peak memory of the process."""
    run = tmp / "run"
    run.mkdir()
    with (run / "results.jsonl").open("w", encoding="utf-8") as f:
        for i in range(100_000):
            f.write(json.dumps({"id": f"q{i}", "em": 1.0, "f1": 1.0, "latency": 1.0, "llm_calls": 1,
                                "tokens": {"total": 10, "input": 8, "output": 2}, "health": {}, "diagnostics": {},
                                "trace": {"llm_calls": [{"messages": [{"role": "user", "content": "x" * 3000}]}]}})
                    + "\n")
    code = ("import resource\nfrom mhqa_graph.eval import compare\n"
            f"compare([{str(run)!r}, {str(run)!r}])\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    peak = int(done.stdout.strip() or 0)
    size = (run / "results.jsonl").stat().st_size >> 20
    return 1, int(done.returncode != 0 or peak > 400), f"peak {peak} MB (file {size} MB)"


def duplicate_ids(tmp: Path) -> Result:
    """A question file with a repeated id: the eval says how many rows it skipped."""
    data = hotpot_file(tmp / "q.jsonl", ["Where?", "When?"])
    data.write_text(data.read_text(encoding="utf-8") + data.read_text(encoding="utf-8").splitlines()[0] + "\n",
                    encoding="utf-8")
    done = mhqa("eval", str(data), "--dataset", "hotpotqa", "--agent", "direct", "--llm",
                'fake:["<answer>Tulsa</answer>"]', "--store", uri(tmp / "s"), "--out", str(tmp / "run"))
    said = "1 question row skipped" in done.stderr
    return 1, int(broken(done) or not said), "counted in a warning" if said else "silent"


def one_line(done: subprocess.CompletedProcess) -> bool:
    """Exit 2 with one stderr line `error: <Type>: ...` and no traceback."""
    lines = done.stderr.strip().splitlines()
    return done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and ":" in lines[0][7:]


def settings_range(tmp: Path) -> Result:
    """make_context with NaN, infinite and huge numbers (and `mhqa ask --model-timeout nan`): each an InvalidInput
    naming the setting, before any work."""
    tries = [("model_timeout", math.nan), ("model_timeout", math.inf), ("model_timeout", 1e300),
             ("retry_backoff", math.nan), ("top_k", 1001), ("max_new_tokens", 10**12)]
    accepted = []
    for name, value in tries:
        try:
            make_context("rag", llm="fake", **{name: value})
            accepted.append(f"{name}={value:g}")
        except Exception as exc:  # noqa: BLE001 - a probe counts any other outcome as a failure
            if type(exc).__name__ != "InvalidInput" or name not in str(exc):
                accepted.append(f"{name}={value:g} ({type(exc).__name__})")
    done = mhqa("ask", "Where?", "--agent", "direct", "--llm", 'fake:["<answer>Tulsa</answer>"]',
                "--model-timeout", "nan")
    if not (one_line(done) and "model_timeout" in done.stderr):
        accepted.append(f"--model-timeout nan (exit {done.returncode})")
    return len(tries) + 1, len(accepted), ("accepted " + ", ".join(accepted)) if accepted else \
        "InvalidInput naming each"


def untyped_errors(tmp: Path) -> Result:
    """Inputs that met an untyped exception: `~nosuchuser` in model specs and a store path, a 5,000-digit
    `threads=`, `neo4j://u:p@[::1`, a 300-character lora name, a run.json that is not an object, and rich markup
    in an `--out`, a run folder's name and its model spec. Each must be one line (`error: <Type>: ...`, exit 2, the
    long name not echoed whole) or, for the last two, succeed."""
    ask = ("ask", "Where?", "--agent", "direct", "--llm")
    pack = "llamacpp:qwen2.5-coder-1.5b"
    long_name = "lora" + "x" * 296
    refused = {"hf ~user": (*ask, "hf:~nosuchuser/model"), "lora ~user": (*ask, f"{pack}?lora=file:~nosuchuser/a.gguf"),
               "store ~user": ("stats", "--store", "embedded://~nosuchuser/s"),
               "threads 5000 digits": (*ask, f"{pack}?threads={'9' * 5000}"),
               "neo4j [::1": ("stats", "--store", "neo4j://u:p@[::1"),
               "lora 300 chars": (*ask, f"{pack}?lora={long_name}")}
    failed = [name for name, args in refused.items()
              if not one_line(done := mhqa(*args)) or long_name in done.stderr]
    questions = hotpot_file(tmp / "q.jsonl", ["Where?"])
    def evaluate(out: Path) -> subprocess.CompletedProcess:
        return mhqa("eval", str(questions), "--dataset", "hotpotqa", "--agent", "direct", "--llm",
                    'fake:["<answer>Tulsa</answer>"]', "--store", uri(tmp / "s"), "--out", str(out))
    for name, text in (("run.json []", "[]"), ("run.json torn", '{"agent": ')):
        out = tmp / f"run-{len(text)}"
        out.mkdir()
        (out / "run.json").write_text(text, encoding="utf-8")
        if not one_line(evaluate(out)):
            failed.append(name)
    run = tmp / "r[red]"
    done = mhqa("eval", str(questions), "--dataset", "hotpotqa", "--agent", "direct", "--llm",
                'fake:["<answer>[/bold]</answer>"]', "--store", uri(tmp / "s"), "--out", str(run))
    exported = mhqa("export", str(run), "--format", "sft", "--out", str(tmp / "ex[/bold]"))
    if broken(exported) or exported.returncode != 0 or done.returncode != 0:
        failed.append("export --out ex[/bold]")
    reported = mhqa("report", str(run))
    if broken(reported) or reported.returncode != 0 or "r[red]" not in reported.stdout:
        failed.append("report r[red] of a [/bold] llm")
    return len(refused) + 4, len(failed), ("untyped: " + ", ".join(failed)) if failed else "one line each"


def trusting_files(tmp: Path) -> Result:
    """Symlinks planted in an export's --out (`sft.jsonl`, `dataset_info.json`) and in a committed MyGO checkpoint
    (a weights file, a whole stage folder), then state.json files of the wrong types: refused with a typed error,
    nothing outside written or copied."""
    from types import SimpleNamespace

    from mhqa_graph.training.checkpoints import restore_checkpoint
    from mhqa_graph.training.mygo import MyGOTrainer

    from mhqa_graph.errors import MhqaError

    precious = tmp / "precious.txt"
    precious.write_text("keep", encoding="utf-8")
    questions = hotpot_file(tmp / "q.jsonl", ["Where?"])
    mhqa("eval", str(questions), "--dataset", "hotpotqa", "--agent", "direct", "--llm",
         'fake:["<answer>Tulsa</answer>"]', "--store", uri(tmp / "s"), "--out", str(tmp / "run"))
    failed = []
    for name in ("sft.jsonl", "dataset_info.json"):
        out = tmp / f"ex-{name}"
        out.mkdir()
        (out / name).symlink_to(precious)
        done = mhqa("export", str(tmp / "run"), "--format", "sft", "--out", str(out))
        if not one_line(done) or precious.read_text(encoding="utf-8") != "keep":
            failed.append(f"export {name}")
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "state.json").write_text('{"iteration": 9, "tau": 0.5}', encoding="utf-8")
    for name in ("weights link", "stage link"):
        records, out = tmp / f"records-{name[0]}", tmp / f"out-{name[0]}"
        stage = records / "checkpoint" / "iter1"
        stage.parent.mkdir(parents=True)
        if name == "stage link":
            stage.symlink_to(outside)
        else:
            stage.mkdir()
            (stage / "state.json").write_text('{"iteration": 1, "tau": 0.5}', encoding="utf-8")
            (stage / "adapter_model.safetensors").symlink_to(precious)
        try:
            restore_checkpoint(str(records), out)
            failed.append(f"restore {name}")
        except Exception as exc:  # noqa: BLE001 - a probe counts any other outcome as a failure
            copied = [p for p in out.rglob("*") if p.is_file() and p.read_bytes() == b"keep"] if out.exists() else []
            if not isinstance(exc, MhqaError) or copied:
                failed.append(f"restore {name} ({type(exc).__name__})")
    for i, text in enumerate(("[]", '{"iteration": "1", "tau": 0.5}', '{"iteration": 1, "tau": "hot"}')):
        out = tmp / f"state-{i}"
        (out / "iter1" / "checkpoint").mkdir(parents=True)
        (out / "iter1" / "checkpoint" / "state.json").write_text(text, encoding="utf-8")
        trainer = object.__new__(MyGOTrainer)
        trainer.config, trainer.out, trainer.model = SimpleNamespace(dev=SimpleNamespace(records=None)), out, object()
        try:
            trainer.resume()
            failed.append(f"state {text}")
        except Exception as exc:  # noqa: BLE001 - a probe counts any other outcome as a failure
            if not isinstance(exc, MhqaError):
                failed.append(f"state {text} ({type(exc).__name__})")
    return 7, len(failed), ("trusted: " + "; ".join(failed)) if failed else "refused, typed"


def noise(tmp: Path) -> Result:
    """auto with a budget its design runs out of (3 questions): nothing on stderr or in the log; and a probe row
    that raises or times out: a failed row with its reason, the table going on."""
    script = tmp / "auto.py"
    script.write_text(textwrap.dedent(f"""
        import json
        from mhqa_graph import Passage, open_store
        from mhqa_graph.graphs import build_graph, make_context
        from mhqa_graph.testing.fakes import FakeChatModel
        store = open_store({uri(tmp / "s")!r})
        store.add_passages("wiki", [Passage("p1", "Inception", "Inception is a film by Christopher Nolan.")])
        plan = json.dumps({{"subgoals": ["Who directed Inception?", "Where was [Answer1] born?"]}})
        said = json.dumps({{"reasoning": "so", "sufficient": True, "answer": "Nolan"}})
        for i in range(3):
            models = {{"answer": FakeChatModel(responses=["<answer>Paris</answer>", "London"], cycle=False),
                       "plan": FakeChatModel(responses=[plan]), "analysis": FakeChatModel(responses=[said]),
                       "rewrite": FakeChatModel(responses=['{{"query": "x"}}'])}}
            ctx = make_context("auto", llm="fake", role_llms=models, store=store, corpus="wiki", budget=4)
            out = build_graph("auto").invoke({{"question": f"Where was the director of Inception {{i}} born?"}},
                                             context=ctx)
            print(out["answered_by"] or "none")
    """), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    said = [line for line in done.stderr.splitlines() if line.strip()]
    table = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import subprocess, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import probes
        def raises(tmp): raise RuntimeError("boom")
        def times_out(tmp): raise subprocess.TimeoutExpired(["mhqa"], 600)
        probes.PROBES.update({{"raises": raises, "times-out": times_out}})
        sys.argv = ["probes.py", "--only", "raises", "times-out"]
        probes.main()
    """)], capture_output=True, text=True, timeout=120)
    rows = [line for line in table.stdout.splitlines() if line.startswith(("| raises |", "| times-out |"))]
    failures = (bool(said) or done.returncode != 0) + (2 - sum("| 1 | 1 |" in row for row in rows))
    return 3, failures, f"{len(said)} stderr lines; {len(rows)} of 2 failing rows in the table"


LONG_NAME = "n" * 10_000  # longer than the 8,164 bytes a Neo4j range index takes


def long_name(tmp: Path) -> Result:
    """A 1,001-row passage file and triple file, one row's passage id or entity name 10 KB long: with --skip-bad the
    embedded store and Neo4j (the recording driver) both keep the other 1,000; without it, one typed line."""
    from typing import cast

    from mhqa_graph.ingest.files import read_passages_file, read_triples_file
    from mhqa_graph.ingest.runner import ingest
    from mhqa_graph.store import cypher
    from mhqa_graph.store.neo4j_backend import Neo4jStore
    from mhqa_graph.testing.recording_driver import RecordingDriver
    from neo4j import Driver

    written: dict[str, int] = {}
    adds = {getattr(cypher, name): name for name in ("ADD_PASSAGES", "ADD_ENTITIES", "ADD_TRIPLES")}

    def respond(query: str, params: dict) -> list[dict]:
        """The recording driver's answers; it fails an over-long index key before asking, as the server does."""
        if query in (cypher.COLLECTION, cypher.MERGE_COLLECTION):
            return [{"embedder": "hash:256", "dim": 256, "size": 0}]
        if query in adds:
            written[adds[query]] = written.get(adds[query], 0) + len(params["rows"])
            return [{"added": len(params["rows"])}]
        return []

    rows = [{"id": LONG_NAME if i == 500 else f"p{i}", "title": "T", "text": f"Passage {i}."} for i in range(1001)]
    (tmp / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp / "t.tsv").write_text("".join(f"{LONG_NAME if i == 500 else f'e{i}'}\tr\tx{i}\n" for i in range(1001)),
                               encoding="utf-8")
    skipped = mhqa("ingest", "passages", str(tmp / "p.jsonl"), "--corpus", "c", "--store", uri(tmp / "s"),
                   "--skip-bad")
    with open_store(uri(tmp / "s"), read_only=True) as store:
        kept = [store.stats().corpora.get("c", {}).get("passages", 0)]
    failures = int(broken(skipped) or skipped.returncode != 0 or kept[0] != 1000)
    refused = mhqa("ingest", "triples", str(tmp / "t.tsv"), "--graph", "g", "--store", uri(tmp / "s"))
    failures += broken(refused) or refused.returncode != 2 or "IngestError" not in refused.stderr
    for statement, items in (("ADD_PASSAGES", {"corpus": "c", "passages": read_passages_file(tmp / "p.jsonl",
                                                                                            yield_errors=True)}),
                             ("ADD_TRIPLES", {"graph": "g", "triples": read_triples_file(tmp / "t.tsv",
                                                                                         yield_errors=True)})):
        written.clear()
        neo4j = Neo4jStore(cast(Driver, RecordingDriver(respond)), embedder="hash:256", database="probe")
        try:
            ingest(neo4j, skip_bad=True, **items)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - a probe counts what was kept
            pass
        kept.append(written.get(statement, 0))
        failures += kept[-1] != 1000
    return 4, failures, (f"1,001-row files: embedded kept {kept[0]:,} passages, Neo4j {kept[1]:,} passages and "
                         f"{kept[2]:,} triples; without --skip-bad exit {refused.returncode}")


def built_from_edit(tmp: Path) -> Result:
    """A 400-passage HotpotQA file and a 400-fact PathQuestion KB, each with one row edited (one the old sample of
    17 did not check) after its environment was built: the next eval must refuse the store, not use the old text."""
    hotpot = hotpot_file(tmp / "q.jsonl", [f"Where is town {i}?" for i in range(400)])
    (tmp / "pq").mkdir()
    kb = tmp / "pq" / "2H-kb.txt"
    kb.write_text("".join(f"e{i}\tr\te{i + 1}\n" for i in range(400)), encoding="utf-8")
    pq = tmp / "pq" / "PQ-2H.txt"
    pq.write_text("".join(f"where is e{i}\te{i + 2}\te{i}#r#e{i + 1}#r#e{i + 2}\n" for i in range(3)), encoding="utf-8")

    def run(dataset: str, path: Path, out: str) -> subprocess.CompletedProcess:
        return mhqa("eval", str(path), "--dataset", dataset, "--agent", "direct", "--limit", "1", "--llm",
                    'fake:["<answer>x</answer>"]', "--store", uri(tmp / "s"), "--out", str(tmp / out))

    built = [run("hotpotqa", hotpot, "h1"), run("pathquestion", pq, "p1")]
    lines = hotpot.read_text(encoding="utf-8").splitlines()
    lines[7] = lines[7].replace("Page 7 is about Tulsa.", "Page 7 is about Boston.")
    hotpot.write_text("\n".join(lines) + "\n", encoding="utf-8")
    facts = kb.read_text(encoding="utf-8").splitlines()
    facts[7] = "e7\tr\te9"
    kb.write_text("\n".join(facts) + "\n", encoding="utf-8")
    edited = [run("hotpotqa", hotpot, "h2"), run("pathquestion", pq, "p2")]
    failures = sum(b.returncode != 0 or broken(b) or e.returncode != 2 or broken(e)
                   or "EnvironmentMismatch" not in e.stderr for b, e in zip(built, edited))
    return 2, failures, f"after the edit: exit {', '.join(str(e.returncode) for e in edited)}" + (
        " (EnvironmentMismatch)" if not failures else "")


def embedder_dim(tmp: Path) -> Result:
    """`embedder=hash:0`, a negative and a huge dimension in the store URI of an ingest: refused in one line before
    anything is written."""
    import sqlite3

    rows = tmp / "p.jsonl"
    rows.write_text("".join(json.dumps({"id": f"p{i}", "title": "T", "text": f"Passage {i}."}) + "\n"
                            for i in range(300)), encoding="utf-8")
    failures, tracebacks, stored = 0, 0, 0
    for i, dim in enumerate(("0", "-3", str(10**12))):
        root = tmp / f"s{i}"
        done = mhqa("ingest", "passages", str(rows), "--corpus", "c", "--store", f"embedded://{root}?embedder=hash:{dim}")
        if (root / "store.sqlite").exists():
            with sqlite3.connect(root / "store.sqlite") as db:
                stored += db.execute("SELECT count(*) FROM passages").fetchone()[0]
        tracebacks += "Traceback" in done.stderr
        failures += broken(done) or done.returncode != 2 or (root / "store.sqlite").exists()
    return 3, failures, f"{tracebacks} tracebacks, {stored} passages left in stores that cannot be searched"


def uri_fragment(tmp: Path) -> Result:
    """A '#' in a store URI, before `?embedder=` (which it hid) and after it: refused in one line; the folder `st#1`
    written `st%231` keeps working."""
    import sqlite3

    rows = tmp / "p.jsonl"
    rows.write_text(json.dumps({"id": "a", "title": "A", "text": "Alpha."}) + "\n", encoding="utf-8")
    failures, ran = 0, 0
    for store in (f"embedded://{tmp}/st#1?embedder=hash:64", f"embedded://{tmp}/s2?embedder=hash:64#x"):
        done = mhqa("ingest", "passages", str(rows), "--corpus", "c", "--store", store)
        ran += done.returncode == 0
        failures += broken(done) or done.returncode != 2 or "InvalidStoreURI" not in done.stderr
    done = mhqa("ingest", "passages", str(rows), "--corpus", "c", "--store", f"embedded://{tmp}/st%231?embedder=hash:64")
    embedder = None
    if (tmp / "st#1" / "store.sqlite").exists():
        with sqlite3.connect(tmp / "st#1" / "store.sqlite") as db:
            embedder = db.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()[0]
    failures += broken(done) or done.returncode != 0 or embedder != "hash:64"
    wrong = ""
    if (tmp / "st" / "store.sqlite").exists():
        with sqlite3.connect(tmp / "st" / "store.sqlite") as db:
            [used] = db.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()
        wrong = f"; `st#1?embedder=hash:64` wrote `st` with {used}"
    return 3, failures, f"{ran} of 2 ingested (exit 0){wrong}"


def concurrent_builds(tmp: Path) -> Result:
    """Ten `mhqa eval`s that must build the same environment (3,000 passages), started together on one new store:
    each must run; the environment is ingested once."""
    data = hotpot_file(tmp / "q.jsonl", [f"Where is town {i}?" for i in range(3000)])
    procs = [subprocess.Popen([sys.executable, "-m", "mhqa_graph.cli", "eval", str(data), "--dataset", "hotpotqa",
                               "--agent", "direct", "--limit", "2", "--llm", 'fake:["<answer>Tulsa</answer>"]',
                               "--store", uri(tmp / "s"), "--out", str(tmp / f"run{i}")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
             for i in range(10)]
    said = [p.communicate(timeout=600)[1] for p in procs]
    locked = sum("StoreLocked" in err for err in said)
    failures = sum(p.returncode != 0 or "Traceback" in err for p, err in zip(procs, said))
    ingested = 0
    for i in range(10):
        summary = tmp / f"run{i}" / "summary.json"
        if summary.exists():
            ingested += bool(json.loads(summary.read_text(encoding="utf-8")).get("environment", {}).get("ingested"))
    return 10, failures, f"{locked} exited StoreLocked; {ingested} ingested"


def served_graph(tmp: Path) -> Result:
    """Requests a hostile web page (or a script) sends to the served graph, through the middleware langgraph.json
    mounts (`mhqa_graph.studio`) in front of an app that stands for the server: a try fails when the request reaches
    the app. A foreign Origin, a rebound host name, a model URL, another store, an assistant set to a model URL."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from mhqa_graph.studio import CheckRuns

    with open_store(uri(tmp / "own")) as store:
        store.add_passages("docs", passages(3))
    reached: list[str] = []

    async def served(request) -> JSONResponse:
        reached.append(request.url.path)
        return JSONResponse({"answer": "x"})

    app = Starlette(routes=[Route("/runs/wait", served, methods=["POST"]),
                            Route("/assistants/{aid}", served, methods=["PATCH"])], middleware=[Middleware(CheckRuns)])
    run = {"assistant_id": "rag", "input": {"question": "Who?"}}
    foreign = {"llm": "openai:http://127.0.0.1:9/v1#m", "corpus": "docs"}
    tries = [("POST", "/runs/wait", run | {"context": {"llm": 'fake:["x"]', "corpus": "docs"}},
              {"origin": "https://evil.example"}),
             ("POST", "/runs/wait", run | {"context": {"llm": 'fake:["x"]', "corpus": "docs"}},
              {"host": "evil.example:2024"}),
             ("POST", "/runs/wait", run | {"context": foreign}, {}),
             ("POST", "/runs/wait", run | {"context": {"llm": 'fake:["x"]', "corpus": "docs",
                                                       "store": uri(tmp / "other")}}, {}),
             ("PATCH", "/assistants/a1", {"context": foreign}, {})]
    env = {"MHQA_STORE": uri(tmp / "own")} | {k: "" for k in ("MHQA_SERVE_LLMS", "MHQA_SERVE_STORES",
                                                             "MHQA_SERVE_ORIGINS", "MHQA_SERVE_HOSTS")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = TestClient(app, base_url="http://127.0.0.1:2024")
        codes = [client.request(method, path, json=body, headers=headers).status_code
                 for method, path, body, headers in tries]
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return len(tries), len(reached), f"{len(reached)} of {len(tries)} reached the server (HTTP {sorted(set(codes))})"


def secrets_in_records(tmp: Path) -> Result:
    """A spec with userinfo and a server that echoes the Authorization header back in its error: an eval's run.json,
    summary.json, records and `mhqa report`; `ask --json`; and a spec holding `?api_key=`. A try fails when the
    password or the key reaches what was written or printed, or the `?api_key=` spec is taken."""
    from mhqa_graph.testing.endpoint import RecordingEndpoint, echoing_refusal

    server = RecordingEndpoint(echoing_refusal)
    url, key = server.url.removeprefix("http://"), "sk-probe-0123456789"
    env = {**os.environ, "OPENAI_API_KEY": key, "MHQA_OPENAI_KEY_URLS": f"http://{url}"}
    try:
        data = hotpot_file(tmp / "q.jsonl", ["Where?"])
        run = [sys.executable, "-m", "mhqa_graph.cli"]
        done = [subprocess.run([*run, "eval", str(data), "--dataset", "hotpotqa", "--agent", "direct", "--llm",
                                f"openai:http://u:PASSWORD1@{url}#m", "--store", uri(tmp / "s"), "--out",
                                str(tmp / "run")], capture_output=True, text=True, env=env, timeout=120)]
        done.append(subprocess.run([*run, "report", str(tmp / "run")], capture_output=True, text=True, env=env,
                                   timeout=120))
        written = "".join(p.read_text(encoding="utf-8", errors="replace") for p in (tmp / "run").glob("*.json*"))
        leaked_eval = "PASSWORD1" in written + done[1].stdout or not written
        ask = subprocess.run([*run, "ask", "Where?", "--agent", "direct", "--llm", f"openai:http://{url}#m",
                              "--json", "--store", uri(tmp / "s")], capture_output=True, text=True, env=env,
                             timeout=120)
        leaked_ask = key in ask.stdout + ask.stderr or "invalid credentials" not in ask.stdout
        taken = subprocess.run([*run, "ask", "Where?", "--agent", "direct", "--llm",
                                f"openai:http://{url}?api_key={key}#m", "--store", uri(tmp / "s")],
                               capture_output=True, text=True, env=env, timeout=120)
        refused = taken.returncode == 2 and "OPENAI_API_KEY" in taken.stderr and key not in taken.stderr
    finally:
        server.close()
    failures = int(leaked_eval) + int(leaked_ask) + int(not refused)
    return 3, failures, ("no secret written or printed; ?api_key= refused" if not failures else
                         f"eval leaked: {leaked_eval}, ask leaked: {leaked_ask}, ?api_key= refused: {refused}")


def bounded_caches(tmp: Path) -> Result:
    """200 runs in one process naming one store under 200 spellings and 200 reply lengths: stores and models the
    process holds, and its open files. A try fails when more than one store or one model is held."""
    from mhqa_graph.graphs import calls

    with open_store(uri(tmp / "kb")) as store:
        store.add_passages("docs", passages(3))
    (tmp / "x").mkdir()
    graph, before = build_graph("rag"), len(os.listdir("/proc/self/fd"))
    held = (len(calls._stores), len(calls._models))
    for i in range(200):
        spelling = uri(tmp / "kb") if i % 2 else uri(tmp / "x" / ("." + "/." * i) / ".." / "kb")
        context = make_context("rag", llm='fake:["<answer>Tulsa</answer>"]', store=spelling, corpus="docs",
                               max_new_tokens=100 + i)
        graph.invoke({"question": "Where?"}, context=context)
    stores, models = len(calls._stores) - held[0], len(calls._models) - held[1]
    opened = len(os.listdir("/proc/self/fd")) - before
    return 2, int(stores > 1) + int(models > 1), f"{stores} store and {models} model held, +{opened} open files"


PROBES: dict[str, Callable[[Path], Result]] = {
    "surrogate-eval": surrogate_eval, "surrogate-ask": surrogate_ask, "handles": handles,
    "readers-during-ingest": readers_during_ingest, "two-evals-one-out": two_evals_one_out,
    "damaged-sqlite": damaged_sqlite, "indexes-ahead": indexes_ahead, "nested-json": nested_json,
    "vector-files": vector_files, "model-timeout": model_timeout, "topic-entities": topic_entities,
    "trace-size": trace_size, "hub-node-info": hub_node_info, "ctrl-c": ctrl_c,
    "store-path-chars": store_path_chars, "long-integer": long_integer, "torn-utf8-export": torn_utf8_export,
    "planted-symlinks": planted_symlinks, "other-file-corpus": other_file_corpus, "key-separator": key_separator,
    "disk-full": disk_full, "report-memory": report_memory, "duplicate-ids": duplicate_ids,
    "settings-range": settings_range, "untyped-errors": untyped_errors, "trusting-files": trusting_files,
    "noise": noise,
    "long-name": long_name, "built-from-edit": built_from_edit, "embedder-dim": embedder_dim,
    "uri-fragment": uri_fragment, "concurrent-builds": concurrent_builds,
    "served-graph": served_graph, "secrets-in-records": secrets_in_records, "bounded-caches": bounded_caches,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=list(PROBES), help="run these probes only")
    args = ap.parse_args()
    print("| probe | tries | failures | figure | seconds |\n|---|---|---|---|---|")
    for name in args.only or PROBES:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
            try:
                tries, failures, figure = PROBES[name](Path(tmp))
            except Exception as exc:  # noqa: BLE001 - a row that raises (a subprocess timed out) is a failed row
                reason = " ".join(f"{type(exc).__name__}: {exc}".split())
                tries, failures, figure = 1, 1, f"stopped: {reason[:300]}"
        print(f"| {name} | {tries} | {failures} | {figure} | {time.perf_counter() - started:.0f} |", flush=True)


if __name__ == "__main__":
    main()
