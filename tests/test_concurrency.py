"""64 questions at once against one store: no errors, and the same answers as one at a time, when the
model is deterministic (its reply depends only on the prompt). Both asyncio (ainvoke) and threads (invoke);
the embedded store and Neo4jStore on the recording driver."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
from mhqa_graph.graphs import build_graph, make_context

from mhqa_graph.store import open_store
from mhqa_graph.store.cypher import ALL_STATEMENTS
from mhqa_graph.store.neo4j_backend import Neo4jStore
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.testing.recording_driver import RecordingDriver
from mhqa_graph.types import Passage
from neo4j import Driver

N = 64
PEOPLE = [f"Person {chr(65 + i // 8)}{i % 8}" for i in range(N)]
TRIPLES = [(f"Film {i}", "directed by", p) for i, p in enumerate(PEOPLE)] + \
          [(p, "born in", f"City {i % 13}") for i, p in enumerate(PEOPLE)]
PASSAGES = [Passage(f"p{i}", f"Film {i}", f"Film {i} is a film directed by {p}.") for i, p in enumerate(PEOPLE)]
QUESTIONS = [f"Where was the director of Film {i} born?" for i in range(N)]


def last(messages) -> str:
    return messages[-1].text


def rag_reply(messages) -> str:
    """The title of the first passage shown, so the answer depends on retrieval too."""
    found = re.search(r"\[1\] ([^:\n]+):", last(messages))
    return f"<answer>{found.group(1) if found else 'none'}</answer>"


def omne_reply(messages) -> str:
    """entity_matcher on the film, node_info on its best match, then the first fact's entity."""
    turns = sum(1 for m in messages if m.type == "ai")
    if turns == 0:
        film = re.search(r"Film \d+", messages[1].text).group(0)
        return f'<tool_call>{{"name": "entity_matcher", "arguments": {{"query": "{film}"}}}}</tool_call>'
    response = re.search(r"<tool_response>\n(.*?)\n", last(messages), re.DOTALL)
    top = response.group(1).strip() if response else ""
    if turns == 1 and top:
        return json.dumps({"name": "node_info", "arguments": {"entity": top}})
    other = re.search(r"-> (.+)$", last(messages), re.MULTILINE)
    return f"<answer>{other.group(1) if other else top}</answer>"


def mujica_reply(messages) -> str:
    """Planner: one sub-question, then the answers joined; worker: context 1's text, hashed."""
    text = last(messages)
    if "Contexts:" in text:
        first = re.search(r"\[1\] (.*)", text)
        digest = hashlib.sha1((first.group(1) if first else "").encode()).hexdigest()[:8]
        return json.dumps({"relevant": [1], "answer": digest})
    if "(none yet)" in text:
        film = re.search(r"Film \d+", text).group(0)
        return json.dumps({"subquestions": [{"id": "q1", "question": f"Who directed {film}?", "depends_on": []},
                                            {"id": "q2", "question": "Where was #q1 born?", "depends_on": ["q1"]}]})
    if "not answered yet" in text:
        return json.dumps({"subquestions": []})
    return json.dumps({"answer": " / ".join(re.findall(r"-> (\w+)", text))})


REPLIES = {"rag": rag_reply, "omne": omne_reply, "mujica": mujica_reply}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('conc')}/s?embedder=hash")
    s.add_triples("kg", TRIPLES)
    s.add_passages("docs", PASSAGES)
    yield s
    s.close()


def context(agent: str, store) -> Any:
    return make_context(agent, llm=FakeChatModel(respond=REPLIES[agent]), store=store, corpus="docs", graph="kg",
                        top_k=3, max_rounds=4)


def answers(outputs: list[dict]) -> list[str]:
    assert all(o.get("error") is None for o in outputs), [o.get("error") for o in outputs if o.get("error")]
    return [o["answer"] for o in outputs]


def check_concurrent_matches_serial(agent: str, store) -> list[str]:
    graph, ctx = build_graph(agent), context(agent, store)
    serial = answers([graph.invoke({"question": q}, context=ctx) for q in QUESTIONS])
    assert len(set(serial)) > N // 4, "the answers should depend on the question"

    async def gather() -> list[dict]:
        return await asyncio.gather(*(graph.ainvoke({"question": q}, context=ctx) for q in QUESTIONS))

    assert answers(asyncio.run(gather())) == serial
    with ThreadPoolExecutor(max_workers=N) as pool:
        assert answers(list(pool.map(lambda q: graph.invoke({"question": q}, context=ctx), QUESTIONS))) == serial
    return serial


@pytest.mark.parametrize("agent", ["rag", "omne", "mujica"])
def test_64_concurrent_questions_on_the_embedded_store(agent, store):
    serial = check_concurrent_matches_serial(agent, store)
    if agent == "rag":
        assert serial[:3] == ["Film 0", "Film 1", "Film 2"]
    if agent == "omne":
        assert "Person A0" in serial[0]  # Film 0 -> entity_matcher -> node_info -> its director


def neo4j_responder(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Deterministic search answers: the passages whose title words all occur in the query."""
    s = ALL_STATEMENTS
    if query in (s["COLLECTION"], s["MERGE_COLLECTION"]):
        return [{"embedder": "hash:256", "dim": 256}]
    if query == s["PASSAGE_FULLTEXT"]:
        words = set(re.findall(r"\w+", params["query"]))
        hits = [{"id": p.id, "title": p.title, "text": p.text, "score": 1.0}
                for p in PASSAGES if set(p.title.split()) <= words]
        return [{"fetched": len(hits), "hits": hits[:params["k"]]}]
    if query == s["PASSAGE_VECTOR"]:
        n = int(hashlib.sha1(str(params["vector"][:4]).encode()).hexdigest(), 16) % N
        return [{"fetched": 1, "hits": [{"id": f"p{n}", "title": f"Film {n}", "text": PASSAGES[n].text, "score": 0.5}]}]
    return []


def test_64_concurrent_questions_on_neo4j_recording_driver():
    driver = RecordingDriver(neo4j_responder)
    store = Neo4jStore(cast(Driver, driver), embedder="hash:256")
    serial = check_concurrent_matches_serial("rag", store)
    assert serial[:3] == ["Film 0", "Film 1", "Film 2"]
    searches = [c for c in driver.calls if c.query == ALL_STATEMENTS["PASSAGE_FULLTEXT"]]
    assert len(searches) == 3 * N and {c.access_mode for c in searches} == {"READ"}
