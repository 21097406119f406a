"""Embedded-backend specifics: recovery after interruption, damaged directories, locking, threads."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mhqa_graph import CorruptStore, EmbedderMismatch, InvalidInput, InvalidStoreURI, Passage, StoreLocked, open_store
from mhqa_graph.embeddings import MAX_DIM, HashEmbedder, load_embedder
from mhqa_graph.store.embedded import fts_query

TRIPLES = [(f"entity {i}", f"rel {i % 7}", f"entity {(i * 31 + 7) % 500}") for i in range(2000)]
PASSAGES = [Passage(f"p{i}", f"Title {i}", f"Passage number {i} mentions entity {i % 50}.") for i in range(600)]


def _uri(path: Path) -> str:
    return f"embedded://{path}?embedder=hash"


def test_fts_query_quotes_every_word():
    assert fts_query('a "b" OR c* NEAR(d) -- }) DETACH') == '"a" OR "b" OR "or" OR "c" OR "near" OR "d" OR "detach"'
    assert fts_query("?!  ") is None


def test_lost_vector_files_are_rebuilt(tmp_path):
    with open_store(_uri(tmp_path)) as store:
        store.add_passages("docs", PASSAGES)
        before = store.search("docs", "Passage number 17", k=3, mode="dense")
    for f in (tmp_path / "vectors").iterdir():
        f.unlink()
    with open_store(_uri(tmp_path)) as store:
        assert store.search("docs", "Passage number 17", k=3, mode="dense") == before


def test_unreadable_vector_file_is_rebuilt(tmp_path):
    with open_store(_uri(tmp_path)) as store:
        store.add_passages("docs", PASSAGES)
        before = store.search("docs", "Passage number 17", k=3, mode="dense")
    for f in (tmp_path / "vectors").iterdir():
        f.write_bytes(b"garbage")
    with open_store(_uri(tmp_path)) as store:
        assert store.search("docs", "Passage number 17", k=3, mode="dense") == before


KILLED_INGEST = textwrap.dedent("""
    import sys
    from mhqa_graph import open_store
    triples = [(f"entity {i}", f"rel {i % 7}", f"entity {(i * 31 + 7) % 500}") for i in range(2000)]
    with open_store(sys.argv[1]) as store:
        for _ in range(1000):  # ingest again and again until killed
            for i in range(0, len(triples), 100):
                store.add_triples("kg", triples[i:i + 100])
                print("batch", flush=True)
""")


@pytest.mark.parametrize("kill_after", [1, 4, 12])
def test_ingest_killed_midway_then_rerun_matches_uninterrupted(tmp_path, kill_after):
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_INGEST, _uri(killed)], stdout=subprocess.PIPE, text=True)
    for _ in range(kill_after):
        assert proc.stdout.readline().startswith("batch")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with open_store(_uri(killed)) as store:
        store.add_triples("kg", TRIPLES)
        got = (store.stats(), store.node_info("kg", "entity 7"), store.match_entities("kg", "entity 42", k=3))
    with open_store(_uri(tmp_path / "clean")) as store:
        store.add_triples("kg", TRIPLES)
        want = (store.stats(), store.node_info("kg", "entity 7"), store.match_entities("kg", "entity 42", k=3))
    assert got == want


def test_not_a_store_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CorruptStore, match="empty or new directory") as raised:
        open_store(_uri(tmp_path))
    assert "delete" not in str(raised.value)


def test_damaged_database_file(tmp_path):
    with open_store(_uri(tmp_path)) as store:
        store.add_passages("docs", PASSAGES[:5])
    (tmp_path / "store.sqlite").write_bytes(b"this is not sqlite" * 100)
    for wal in tmp_path.glob("store.sqlite-*"):
        wal.unlink()
    with pytest.raises(CorruptStore):
        open_store(_uri(tmp_path))


def test_other_embedder_is_refused(tmp_path):
    with open_store(_uri(tmp_path)) as store:
        store.add_passages("docs", PASSAGES[:5])
    with pytest.raises(EmbedderMismatch):
        open_store(f"embedded://{tmp_path}?embedder=hash:64")
    with open_store(f"embedded://{tmp_path}") as store:  # no embedder: the stored one
        assert store.embedder.spec == "hash:256"


def test_second_writer_process_is_refused(tmp_path):
    with open_store(_uri(tmp_path)) as store:
        store.add_passages("docs", PASSAGES[:5])
        code = f"from mhqa_graph import open_store; open_store({_uri(tmp_path)!r})"
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and "StoreLocked" in done.stderr
        assert time.monotonic() - started < 30


def test_read_only_store_refuses_writes(tmp_path):
    with open_store(_uri(tmp_path)) as store:
        store.add_passages("docs", PASSAGES[:5])
    with open_store(_uri(tmp_path), read_only=True) as store:
        assert len(store.search("docs", "Passage", k=2)) == 2
        with pytest.raises(StoreLocked):
            store.add_passages("docs", PASSAGES[5:6])


def test_a_store_written_before_the_incoming_fact_index_reads_and_gets_it_from_its_next_writer(tmp_path):
    with open_store(_uri(tmp_path)) as store:
        store.add_triples("kg", [("Inception", "directed by", "Christopher Nolan")])
    with sqlite3.connect(tmp_path / "store.sqlite") as db:
        db.execute("DROP INDEX triples_object")
    with open_store(_uri(tmp_path), read_only=True) as store:  # a reader cannot add it
        facts = store.node_info("kg", "Christopher Nolan").facts
        assert [(f.relation, f.other, f.direction) for f in facts] == [("directed by", "Inception", "in")]
    with open_store(_uri(tmp_path)):
        pass
    with sqlite3.connect(tmp_path / "store.sqlite") as db:
        assert db.execute("SELECT 1 FROM sqlite_master WHERE name = 'triples_object'").fetchone()


def test_concurrent_readers_see_the_same_answers(tmp_path):
    with open_store(_uri(tmp_path)) as store:
        store.add_passages("docs", PASSAGES)
        store.add_triples("kg", TRIPLES)
        queries = [f"entity {i}" for i in range(64)]

        def ask(q: str):
            return (store.search("docs", q, k=5), store.match_entities("kg", q, k=5), store.node_info("kg", q))

        serial = [ask(q) for q in queries]
        with ThreadPoolExecutor(16) as pool:
            assert list(pool.map(ask, queries)) == serial


def test_close_releases_the_store_for_another_process(tmp_path):
    store = open_store(_uri(tmp_path))
    store.add_triples("kg", TRIPLES[:10])
    store.node_info("kg", "entity 1")  # lends this thread a pooled connection
    store.close()
    code = f"from mhqa_graph import open_store; open_store({_uri(tmp_path)!r}).close()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_second_writer_in_this_process_is_refused_until_the_first_closes_on_any_thread(tmp_path):
    store = open_store(_uri(tmp_path))
    with pytest.raises(StoreLocked):
        open_store(_uri(tmp_path))
    with open_store(_uri(tmp_path), read_only=True):  # readers take no lock
        pass
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join()
    open_store(_uri(tmp_path)).close()


def test_ingest_writes_only_sqlite_and_vectors(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from mhqa_graph import open_store
        with open_store({_uri(tmp_path)!r}) as store:
            store.add_triples("kg", {TRIPLES[:10]!r})
            store.node_info("kg", "entity 1")
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("ladybug", "pyarrow")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert {p.name for p in tmp_path.iterdir()} <= {"store.sqlite", "store.sqlite-wal", "store.sqlite-shm",
                                                    "store.lock", "vectors"}


def test_a_directory_holding_only_the_lock_file_is_a_new_store(tmp_path):
    (tmp_path / "store.lock").touch()  # a writer killed before it made store.sqlite
    with open_store(_uri(tmp_path)) as store:
        store.add_triples("kg", TRIPLES[:10])
        assert store.node_info("kg", "entity 1").facts


@pytest.mark.parametrize("dim", ["0", "-3", str(MAX_DIM + 1), str(10**12), "x", "", "1.5"])
def test_a_hash_embedder_of_no_or_too_many_dimensions_is_refused_before_anything_is_written(tmp_path, dim):
    """`hash:0` used to commit passages, then fail, leaving a store no search could read (issue 65): the spec is
    checked when the URI is read, before the directory exists."""
    with pytest.raises(InvalidInput, match=rf"'hash:{dim}'.*1\.\.{MAX_DIM}"):
        open_store(f"embedded://{tmp_path}/s?embedder=hash:{dim}")
    with pytest.raises(InvalidInput, match=rf"1\.\.{MAX_DIM}"):
        open_store(f"embedded://{tmp_path}/s", embedder=f"hash:{dim}")
    assert not (tmp_path / "s").exists()
    with pytest.raises(InvalidInput):
        load_embedder(f"hash:{dim}")
    with open_store(f"embedded://{tmp_path}/max?embedder=hash:{MAX_DIM}") as store:
        store.add_passages("docs", PASSAGES[:3])
        assert store.search("docs", "Passage number 1", k=1, mode="dense")[0].id == "p1"


def test_a_hash_embedder_made_directly_checks_its_dimension():
    for dim in (0, -1, MAX_DIM + 1, 2.5, True):
        with pytest.raises(InvalidInput):
            HashEmbedder(dim)  # type: ignore[arg-type]
    assert HashEmbedder(MAX_DIM).embed(["a b"]).shape == (1, MAX_DIM)


@pytest.mark.parametrize("uri", ["embedded://{tmp}/st#1?embedder=hash:64", "embedded://{tmp}/s?embedder=hash:64#x",
                                 "embedded://{tmp}/s#", "embedded:{tmp}/s#x", "neo4j://localhost:7687#x",
                                 "bolt://localhost:7687?database=x#y"])
def test_a_fragment_in_a_store_uri_is_refused(tmp_path, uri):
    """A '#' began a fragment that hid what followed it (`?embedder=`, so the default embedder loaded) and named the
    folder `st` (issue 65): refused, with the spelling that works."""
    uri = uri.format(tmp=tmp_path)
    with pytest.raises(InvalidStoreURI, match="%23"):
        open_store(uri)
    with pytest.raises(InvalidStoreURI, match="%23"):
        open_store(uri, read_only=True, create=False)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_named_with_a_hash_is_written_percent_encoded_and_its_uri_reopens_it(tmp_path):
    with open_store(f"embedded://{tmp_path}/st%231?embedder=hash:64") as store:
        store.add_passages("docs", PASSAGES[:3])
        uri = store.uri
    assert [p.name for p in tmp_path.iterdir()] == ["st#1"] and uri.endswith("/st%231")
    with open_store(uri, read_only=True, create=False) as again:  # the store's own URI names the same folder
        assert again.embedder.spec == "hash:64" and again.stats().corpora == {"docs": {"passages": 3}}
