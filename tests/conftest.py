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
