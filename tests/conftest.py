import functools
import os
from pathlib import Path

import pytest

# the full benchmark sets: ../shared/data beside the repository, or the folder MHQA_TEST_DATA names
DATA = Path(os.environ.get("MHQA_TEST_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data").absolute()
# why a test that needs the full benchmark sets skips, and how to get them
NO_DATA = (f"needs the full benchmark sets at {DATA} (the bundled sample is not enough): "
           "mhqa_graph/demo_data/README.md says which files go there and where each comes from")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The full benchmark sets' folder; the test skips with NO_DATA where it is missing."""
    if not DATA.is_dir():
        pytest.skip(NO_DATA)
    return DATA


@pytest.fixture(scope="session")
def sample() -> Path:
    """The sample the package bundles (mhqa_graph/demo_data/), there in every clone."""
    from mhqa_graph.demo import DEMO_DATA

    return DEMO_DATA


@pytest.fixture(scope="session")
def pq_2h() -> dict[str, list[str]]:
    """Real lines of PathQuestion's files (the package bundles none of PathQuestion), by file name: the first three
    questions of PQ-2H.txt, and the first three facts of 2H-kb.txt with the two of those questions' gold chain."""
    return {
        "PQ-2H.txt": [
            "which nationality is frederica_of_mecklenburg-strelitz 's couple ?\tunited_kingdom(united_kingdom/)\t"
            "frederica_of_mecklenburg-strelitz#spouse#ernest_augustus_i_of_hanover#nationality#"
            "united_kingdom#<end>#united_kingdom",
            "what is the nation of frederica_of_mecklenburg-strelitz 's couple ?\tunited_kingdom(united_kingdom/)\t"
            "frederica_of_mecklenburg-strelitz#spouse#ernest_augustus_i_of_hanover#nationality#"
            "united_kingdom#<end>#united_kingdom",
            "the nation of frederica_of_mecklenburg-strelitz 's couple ?\tunited_kingdom(united_kingdom/)\t"
            "frederica_of_mecklenburg-strelitz#spouse#ernest_augustus_i_of_hanover#nationality#"
            "united_kingdom#<end>#united_kingdom",
        ],
        "2H-kb.txt": [
            "ludwig_ii_of_bavaria\tparents\tmaximilian_ii_of_bavaria",
            "gheorghe_i_tasca\tchildren\tgheorghe_tasca",
            "lothair_of_france\tparents\tgerberga_of_saxony",
            "frederica_of_mecklenburg-strelitz\tspouse\ternest_augustus_i_of_hanover",
            "ernest_augustus_i_of_hanover\tnationality\tunited_kingdom",
        ],
    }


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep tests away from the user's store; model packs may still be read from MHQA_CACHE if set."""
    monkeypatch.setenv("MHQA_STORE", "embedded://" + str(tmp_path_factory.mktemp("default-store")))
    if "MHQA_CACHE" not in os.environ:
        monkeypatch.setenv("MHQA_CACHE", str(Path.home() / ".cache" / "mhqa-graph" / "models"))


REQUIRE_NEO4J = os.environ.get("MHQA_REQUIRE_NEO4J") == "1"  # set by .ci/run, which starts a server
_live_skips: list[str] = []


def pytest_report_header(config):
    if not os.environ.get("NEO4J_URI"):
        if REQUIRE_NEO4J:
            return "neo4j_live tests: FAIL, MHQA_REQUIRE_NEO4J=1 but NEO4J_URI is not set"
        return "neo4j_live tests: skipped, NEO4J_URI is not set (no live Neo4j server to test)"
    return f"neo4j_live tests: against {os.environ['NEO4J_URI']}" + (" (required)" if REQUIRE_NEO4J else "")


def pytest_collection_modifyitems(config, items):
    """Without NEO4J_URI, skip the live-server tests with one reason (printed in the header and summary),
    unless MHQA_REQUIRE_NEO4J=1 says a server is expected: then they fail (see `_neo4j_live`)."""
    if os.environ.get("NEO4J_URI") or REQUIRE_NEO4J:
        return
    skip = pytest.mark.skip(reason="NEO4J_URI is not set: no live Neo4j server to test")
    for item in items:
        if item.get_closest_marker("neo4j_live"):
            item.add_marker(skip)


@functools.cache
def neo4j_unreachable() -> str | None:
    """Why the server at NEO4J_URI cannot be used (one line), or None; asked once per session, within seconds."""
    uri = os.environ.get("NEO4J_URI")
    if not uri:
        return ("MHQA_REQUIRE_NEO4J=1 expects a live server, but NEO4J_URI is not set (start one: "
                "bash neo4j/server.sh start)")
    try:
        from mhqa_graph.store.neo4j_backend import probe
    except ImportError as e:  # the neo4j extra is missing
        return f"NEO4J_URI is set, but the Neo4j driver is missing ({e}); bash scripts/install.sh neo4j"
    return probe(uri)


@pytest.fixture(scope="session")
def neo4j_uri() -> str:
    """NEO4J_URI, once the server there answered; a missing or down server fails the test with the reason."""
    reason = neo4j_unreachable()
    if reason:
        pytest.fail(reason, pytrace=False)
    return os.environ["NEO4J_URI"]


@pytest.fixture(autouse=True)
def _neo4j_live(request):
    """A neo4j_live test whose server is missing or down fails at once with the reason, never skips."""
    if request.node.get_closest_marker("neo4j_live"):
        request.getfixturevalue("neo4j_uri")


def pytest_runtest_logreport(report):
    if report.skipped and "neo4j_live" in report.keywords:
        _live_skips.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """Where a server is required, a live test that skipped (for any reason) fails the run."""
    if REQUIRE_NEO4J and _live_skips and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if REQUIRE_NEO4J and _live_skips:
        terminalreporter.write_line(f"MHQA_REQUIRE_NEO4J=1: {len(_live_skips)} neo4j_live tests skipped, which fails "
                                    f"the run: {', '.join(_live_skips[:5])}", red=True)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models' matmuls are too small to share between threads: one thread is ~100x faster on a busy machine."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class StoppedTraining(Exception):
    """Raised by `stop_training` where a stopped run would end."""


@pytest.fixture()
def stop_training(monkeypatch):
    """`stop_training(module, step)`: the trainers that `module` builds with its `jsonl_log` callback stop
    (StoppedTraining) before the step after `step`, once that step's checkpoint is saved; returns a function
    that lets them train on."""
    def stop(module, step: int):
        logging = module.jsonl_log

        def stopping_log(path, **tags):
            log = logging(path, **tags)

            def on_step_begin(args, state, control, **kwargs):
                if state.global_step == step:
                    raise StoppedTraining

            log.on_step_begin = on_step_begin
            return log

        monkeypatch.setattr(module, "jsonl_log", stopping_log)
        return lambda: monkeypatch.setattr(module, "jsonl_log", logging)

    stop.error = StoppedTraining
    return stop


@pytest.fixture()
def stop_at(monkeypatch):
    """`stop_at(trainer, method, arg)`: the trainer's `method` raises KeyboardInterrupt when called with `arg`,
    and runs as before with any other (a run stopped between its stages)."""
    def stop(trainer, method: str, arg):
        real = getattr(trainer, method)

        def stopped(value, *args, **kwargs):
            if value == arg:
                raise KeyboardInterrupt
            return real(value, *args, **kwargs)

        monkeypatch.setattr(trainer, method, stopped)

    return stop
