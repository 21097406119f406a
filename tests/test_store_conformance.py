"""The conformance suite, run against every backend that can be reached here."""

import os
import uuid

import pytest

from mhqa_graph import EmbedderMismatch, Passage, open_store
from mhqa_graph.testing.conformance import PASSAGES, StoreConformance


class TestEmbeddedStore(StoreConformance):
    @pytest.fixture
    def store(self, tmp_path):
        with open_store(f"embedded://{tmp_path}/store?embedder=hash") as store:
            yield store

    @pytest.fixture
    def reopen(self):
        def _reopen(store):
            store.close()
            return open_store(store.uri)
        return _reopen


@pytest.mark.neo4j_live
class TestLiveNeo4jStore(StoreConformance):
    """Runs against the server at NEO4J_URI; each test uses its own namespace and cleans up."""

    @pytest.fixture
    def store(self):
        store = _live_store()
        yield store
        _drop_namespace(store.namespace)  # `reopen` may have closed this store
        store.close()

    @pytest.fixture
    def reopen(self):
        opened = []

        def _reopen(store):
            namespace = store.namespace
            store.close()
            again = open_store(os.environ["NEO4J_URI"], embedder="hash")
            again.namespace = namespace
            opened.append(again)
            return again
        yield _reopen
        for again in opened:
            again.close()


def _live_store(embedder: str = "hash"):
    from mhqa_graph.store.neo4j_backend import Neo4jStore

    store = open_store(os.environ["NEO4J_URI"], embedder=embedder)
    assert isinstance(store, Neo4jStore)
    store.namespace = f"t{uuid.uuid4().hex[:8]}"
    return store


def _drop_namespace(namespace: str) -> None:
    with open_store(os.environ["NEO4J_URI"], embedder="hash") as store:
        store.namespace = namespace
        store.drop_namespace()


BIG = 12_000  # more than the deepest vector index query (neo4j_backend.MAX_FETCH)


@pytest.fixture(scope="module")
def populated(neo4j_uri):
    """More passages in corpus `big` than the deepest index query fetches, all about the question's words, then
    the 5 passages of `small`."""
    from mhqa_graph.store.neo4j_backend import MAX_FETCH

    assert BIG > MAX_FETCH
    store = _live_store()
    big = [Passage(f"b{i}", f"Andrzej Żuławski {i}",
                   f"Andrzej Żuławski, the Polish film director, was born in the city of Lviv ({i}).")
           for i in range(BIG)]
    store.add_passages("big", big)
    store.add_passages("small", PASSAGES)
    yield store
    store.drop_namespace()
    store.close()


@pytest.mark.neo4j_live
class TestLiveNeo4jPopulated:
    """A database that holds more than the collection under test, as production ones do."""

    @pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
    def test_small_corpus_finds_its_own_passages(self, populated, mode):
        hits = populated.search("small", "Which city was Andrzej Żuławski born in?", k=3, mode=mode)
        assert "p3" in [h.id for h in hits] and {h.id for h in hits} <= {p.id for p in PASSAGES}
        assert len(populated.search("big", "Andrzej Żuławski Lviv", k=10, mode=mode)) == 10

    def test_long_cjk_and_hyphenated_questions_search(self, populated):
        for question in ("".join(chr(0x4E00 + i) for i in range(3000)),
                         " ".join(f"state-of-the-art-{i}" for i in range(400))):
            populated.search("small", question, k=3, mode="hybrid")  # no too-many-clauses error

    def test_stats_count_both(self, populated):
        assert populated.stats().corpora == {"big": {"passages": BIG}, "small": {"passages": len(PASSAGES)}}


@pytest.mark.neo4j_live
def test_live_schema_of_another_dimension_raises_embedder_mismatch():
    """The vector indexes keep their dimension (256, for `hash`) when every collection is dropped:
    another embedder's dimension is refused with the fix, not left to fail every search."""
    from mhqa_graph.store import cypher

    store = _live_store()
    store.add_triples("kg", [("a", "r", "b")])
    store.drop_namespace()
    others = store._read(lambda tx: tx.run(cypher.EMBEDDERS).data())
    store.close()
    with pytest.raises(EmbedderMismatch) as info:
        _live_store("hash:64").close()
    if not others:  # no collection names an embedder, so only the index's dimension can tell
        assert "256 dimensions, but embedder 'hash:64' makes 64" in str(info.value)
        assert "DROP INDEX" in str(info.value)
