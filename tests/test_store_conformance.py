"""The conformance suite, run against every backend that can be reached here."""

import os
import uuid

import pytest

from mhqa_graph import open_store
from mhqa_graph.testing.conformance import StoreConformance


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
        from mhqa_graph.store.neo4j_backend import Neo4jStore

        store = open_store(os.environ["NEO4J_URI"], embedder="hash")
        assert isinstance(store, Neo4jStore)
        store.namespace = f"t{uuid.uuid4().hex[:8]}"
        yield store
        store.drop_namespace()
        store.close()

    @pytest.fixture
    def reopen(self):
        def _reopen(store):
            namespace = store.namespace
            store.close()
            again = open_store(os.environ["NEO4J_URI"], embedder="hash")
            again.namespace = namespace
            return again
        return _reopen
