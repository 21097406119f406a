"""The agents on a live Neo4j graph: the recorded KG transcripts (tests/recorded/, the real
qwen2.5-coder-1.5b on PathQuestion 2-hop and the 2Wiki evidence KG) replayed with every `node_info` read
from the server at NEO4J_URI instead of the transcript, so each graph walk runs on Neo4j.

The model is replayed by exact prompt, so every fact Neo4j returns must be the recorded one, else the next
prompt differs and the replay fails; the answers must be the recorded answers. `match_entities` and
`search` still come from the transcript: their rankings depend on the full-text engine (see
tests/test_neo4j_parity.py and neo4j/README.md), and the text transcripts (HotpotQA) read nothing else.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest
from mhqa_graph.graphs import build_graph, make_context

from mhqa_graph import open_store
from mhqa_graph.eval.environments import DEV_ENVIRONMENTS, environment_name, prepare
from mhqa_graph.testing.replay import ReplayStore, Transcript, store_key
from mhqa_graph.types import NodeInfo

pytestmark = pytest.mark.neo4j_live
RECORDED = Path(__file__).parent / "recorded"
KG_FILES = sorted(p for p in RECORDED.glob("*.json") if not p.name.startswith("raw-")
                  and json.loads(p.read_text(encoding="utf-8"))["meta"]["settings"].get("graph"))
CASES = [(p, i) for p in KG_FILES for i in range(len(json.loads(p.read_text(encoding="utf-8"))["questions"]))]


class LiveGraphStore(ReplayStore):
    """A replayed store whose node_info reads go to a live store; it keeps what they returned."""

    backend = "replay+live"

    def __init__(self, reads: dict, live) -> None:
        super().__init__(reads)
        self.live = live
        self.live_reads: dict[str, dict] = {}

    def _node_info(self, graph: str, name: str) -> NodeInfo:
        key = store_key("node_info", graph, name)
        try:
            info = self.live.node_info(graph, name)
        except Exception as e:
            self.live_reads[key] = {"error": type(e).__name__}
            raise
        self.live_reads[key] = {"result": asdict(info)}
        return info


@pytest.fixture(scope="module")
def live_graphs(neo4j_uri, data_dir):
    """The graphs of the KG transcripts' environments, ingested into one namespace of the live server."""
    store = open_store(neo4j_uri, embedder="hash")  # node_info does not read embeddings
    store.namespace = f"agents{uuid.uuid4().hex[:8]}"
    try:
        for env in sorted({Transcript.load(p).meta["environment"] for p in KG_FILES}):
            dataset, path = DEV_ENVIRONMENTS[env].dataset, data_dir / DEV_ENVIRONMENTS[env].file
            prepare(store, dataset, path, environment_name(dataset, path))
        yield store
    finally:
        store.drop_namespace()
        store.close()


def test_every_kg_agent_is_covered():
    agents = {Transcript.load(p).meta["agent"] for p in KG_FILES}
    assert {"rag", "opera", "mujica", "omne"} <= agents


@pytest.mark.parametrize("path, i", CASES, ids=[f"{p.stem}-{i}" for p, i in CASES])
def test_recorded_run_reproduces_on_neo4j(live_graphs, path: Path, i: int) -> None:
    transcript = Transcript.load(path)
    transcript.meta["file"] = path.name
    question, agent = transcript.questions[i], transcript.meta["agent"]
    llm, store = transcript.replay_model(), LiveGraphStore(transcript.store, live_graphs)
    context = make_context(agent, llm=llm, store=store, **transcript.meta["settings"])
    inputs = {k: question[k] for k in ("question", "topic_entities") if k in question}
    out = build_graph(agent).invoke(inputs, context=context)
    for key, got in store.live_reads.items():  # Neo4j's facts are the recorded (embedded store's) facts
        recorded = transcript.store.get(key)
        if recorded is not None:
            assert ({"error": recorded["error"]} if "error" in recorded else recorded) == got, key
    llm.assert_complete()
    assert not store.misses, f"store reads not in {path.name}: {store.misses[:3]}"
    assert out["answer"] == question["output"]["answer"] and out.get("error") == question["output"]["error"]
