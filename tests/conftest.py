import os
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture
def data_dir() -> Path:
    if not DATA.is_dir():
        pytest.skip(f"benchmark data not found at {DATA}")
    return DATA


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep tests away from the user's store; model packs may still be read from MHQA_CACHE if set."""
    monkeypatch.setenv("MHQA_STORE", "embedded://" + str(tmp_path_factory.mktemp("default-store")))
    if "MHQA_CACHE" not in os.environ:
        monkeypatch.setenv("MHQA_CACHE", str(Path.home() / ".cache" / "mhqa-graph" / "models"))


def pytest_report_header(config):
    if not os.environ.get("NEO4J_URI"):
        return "neo4j_live tests: skipped, NEO4J_URI is not set (no live Neo4j server to test)"
    return f"neo4j_live tests: against {os.environ['NEO4J_URI']}"


def pytest_collection_modifyitems(config, items):
    """Without NEO4J_URI, skip the live-server tests with one reason (printed in the header and summary)."""
    if os.environ.get("NEO4J_URI"):
        return
    skip = pytest.mark.skip(reason="NEO4J_URI is not set: no live Neo4j server to test")
    for item in items:
        if item.get_closest_marker("neo4j_live"):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models' matmuls are too small to share between threads: one thread is ~100x faster on a busy machine."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
