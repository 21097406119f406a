"""langgraph.json served by `langgraph dev` (the LangGraph Studio backend): every agent is listed with its
context form, and answers through the HTTP API with scripted `fake:` models over a tiny hash-embedder store.

The server runs offline on 127.0.0.1 with a free port; its working directory is a temporary folder, so
the in-memory runtime's `.langgraph_api/` data stays out of the repository.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest
from mhqa_graph.graphs import AGENTS, build_graph
from mhqa_graph.graphs.settings import AgentContext

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "langgraph.json"
LANGGRAPH = shutil.which("langgraph", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
STARTUP_SECONDS = 90
QUESTION = "Where was the director of Inception born?"

pytestmark = pytest.mark.skipif(
    LANGGRAPH is None or find_spec("langgraph_api") is None or find_spec("langgraph_sdk") is None,
    reason="LangGraph Studio server not installed: pip install 'mhqa-graph[studio]' (langgraph-cli[inmem])")


def fake(*replies: str) -> str:
    """A `fake:` model spec replying `replies` in order (and again from the start on the next run)."""
    return "fake:" + json.dumps(list(replies))


def said(answer: str) -> str:
    return json.dumps({"reasoning": "the passage says so", "sufficient": True, "answer": answer})


def call(name: str, **args: str) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


PASSAGES = [
    {"id": "inception", "title": "Inception", "text": "Inception is a 2010 film directed by Christopher Nolan."},
    {"id": "nolan", "title": "Christopher Nolan", "text": "Christopher Nolan was born in London in 1970."}]
TRIPLES = [("Inception", "directed by", "Christopher Nolan"), ("Christopher Nolan", "born in", "London")]
CHAIN = json.dumps({"subquestions": [{"id": "q1", "question": "Who directed Inception?", "depends_on": []},
                                     {"id": "q2", "question": "Where was #q1 born?", "depends_on": ["q1"]}]})

# agent -> the run context Studio would send: plain JSON, models as `fake:` specs scripted per role
CONTEXTS = {
    "opera": {"corpus": "wiki", "llm": fake("unused"), "role_llms": {
        "plan": fake(json.dumps({"subgoals": ["Who directed Inception?", "Where was [Answer1] born?"]})),
        "analysis": fake(said("Christopher Nolan"), said("London")),
        "answer": fake("London")}},
    "mujica": {"corpus": "wiki", "role_llms": {
        "planner": fake(CHAIN, CHAIN, json.dumps({"answer": "London"})),  # round 2 restates the plan: q2 runs
        "worker": fake('{"relevant": [1], "answer": "Christopher Nolan"}', '{"relevant": [1], "answer": "London"}')}},
    "omne": {"graph": "kg", "llm": fake(call("entity_matcher", query="Inception", graph_type="kg"),
                                        call("node_info", entity="Inception", graph_type="kg"),
                                        call("node_info", entity="Christopher Nolan", graph_type="kg"),
                                        "<answer>London</answer>")},
    "rag": {"corpus": "wiki", "top_k": 2, "llm": fake("<answer>London</answer>")},
    "direct": {"llm": fake("<think>Nolan was born in London.</think><answer>London</answer>")},
    "auto": {"corpus": "wiki", "llm": fake("unused"), "role_llms": {  # rag says Paris, no passage holds it: OPERA
        "answer": fake("<answer>Paris</answer>", "London"),
        "plan": fake(json.dumps({"subgoals": ["Who directed Inception?", "Where was [Answer1] born?"]})),
        "analysis": fake(said("Christopher Nolan"), said("London"))}},
}


def trace_checks(agent: str, out: dict) -> None:
    """The agent's own record of the run came back through the API."""
    if agent == "opera":
        assert [s["query"] for s in out["steps"]] == ["Who directed Inception?", "Where was Christopher Nolan born?"]
    elif agent == "mujica":
        assert out["results"]["q2"]["query"] == "Where was Christopher Nolan born?" and out["rounds"] == 3
    elif agent == "omne":
        assert [c["name"] for c in out["tool_calls"]] == ["entity_matcher", "node_info", "node_info"]
    elif agent == "auto":
        assert out["answered_by"] == "opera" and [d["action"] for d in out["decisions"]] == ["escalate", "answer"]
    elif agent == "rag":
        assert out["source"] == "corpus:wiki" and len(out["retrieved"]) == 2
    else:
        assert out["raw"].startswith("<think>")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    """Poll GET /ok until the server answers; fail with the server log if it exits or times out."""
    import httpx

    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"langgraph dev exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/ok", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    pytest.fail(f"langgraph dev not ready after {STARTUP_SECONDS} s:\n{log.read_text()[-4000:]}")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server's whole process group: SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    """`langgraph dev` over langgraph.json, with MHQA_STORE set to a filled tiny store; yields its URL."""
    work = tmp_path_factory.mktemp("studio")
    uri = f"embedded://{work}/store?embedder=hash"
    passages = work / "wiki.jsonl"
    passages.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES), encoding="utf-8")
    triples = work / "kg.tsv"
    triples.write_text("".join("\t".join(t) + "\n" for t in TRIPLES), encoding="utf-8")
    # filled by `mhqa ingest` in child processes, which hold the store's single writer lock only while they run
    for args in (["passages", str(passages), "--corpus", "wiki"], ["triples", str(triples), "--graph", "kg"]):
        done = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "ingest", *args, "--store", uri],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr

    port = free_port()
    env = {**os.environ, "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGGRAPH_NO_VERSION_CHECK": "1",
           "LANGSMITH_TRACING": "false", "LANGCHAIN_TRACING_V2": "false", "MHQA_STORE": uri}
    log = work / "server.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([LANGGRAPH, "dev", "--config", str(CONFIG), "--host", "127.0.0.1",
                                 "--port", str(port), "--no-browser", "--no-reload"],
                                cwd=work, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, log)
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def client(server):
    from langgraph_sdk import get_sync_client

    return get_sync_client(url=server, api_key=None)


def test_every_agent_is_served_with_its_forms(client):
    assistants = client.assistants.search(limit=50)
    assert sorted(a["graph_id"] for a in assistants) == sorted(AGENTS)
    shared = {f.name for f in dataclasses.fields(AgentContext)}
    for assistant in assistants:
        schemas = client.assistants.get_schemas(assistant["assistant_id"])
        assert shared <= set(schemas["context_schema"]["properties"]), assistant["graph_id"]
        assert "question" in schemas["input_schema"]["properties"], assistant["graph_id"]
        assert "answer" in schemas["output_schema"]["properties"], assistant["graph_id"]


@pytest.mark.parametrize("agent", AGENTS)
def test_every_context_field_has_a_description(client, agent):
    """Studio's form shows each field's description beside its label."""
    [assistant] = client.assistants.search(graph_id=agent, limit=1)
    properties = client.assistants.get_schemas(assistant["assistant_id"])["context_schema"]["properties"]
    assert {f.name for f in dataclasses.fields(build_graph(agent).builder.context_schema)} == set(properties)
    assert [name for name, field in properties.items() if len(field.get("description", "")) < 10] == []


@pytest.mark.parametrize("agent", list(AGENTS))
def test_each_agent_answers_through_the_server(client, agent):
    thread = client.threads.create()
    out = client.runs.wait(thread["thread_id"], agent, input={"question": QUESTION}, context=CONTEXTS[agent])
    assert out["answer"] == "London" and out["error"] is None, out
    trace_checks(agent, out)
    state = client.threads.get_state(thread["thread_id"])
    assert state["values"]["question"] == QUESTION and state["next"] == []  # the run is inspectable in Studio


def test_configurable_is_read_as_the_context(client):
    """Older clients send settings as config.configurable; the server passes them on as the context."""
    out = client.runs.wait(None, "direct", input={"question": "Capital of France?"},
                           config={"configurable": {"llm": fake("<answer>Paris</answer>")}})
    assert out["answer"] == "Paris"


def test_assistant_context_is_the_default_of_its_runs(client):
    assistant = client.assistants.create(graph_id="rag", name="rag-wiki",
                                         context={"corpus": "wiki", "llm": fake("<answer>Christopher Nolan</answer>")})
    out = client.runs.wait(None, assistant["assistant_id"], input={"question": "Who directed Inception?"},
                           context={"top_k": 1})
    assert out["answer"] == "Christopher Nolan" and len(out["retrieved"]) == 1


def rejected(call, *args, **kwargs) -> dict:
    """The body of the HTTP 422 a request gets; the server accepted nothing."""
    import httpx

    with pytest.raises(httpx.HTTPStatusError) as caught:
        call(*args, **kwargs)
    response = caught.value.response
    assert response.status_code == 422
    return json.loads(response.read())


def test_invalid_question_is_a_422_with_our_message(client):
    body = rejected(client.runs.wait, None, "direct", input={"question": "   "},
                    context={"llm": fake("<answer>x</answer>")})
    assert body == {"error": "InvalidQuestion", "message": "question is empty"}


@pytest.mark.parametrize(("context", "error", "message"), [
    ({"llm": fake("x"), "top_kk": 3}, "InvalidInput", "rag has no setting(s) top_kk"),
    ({"role_llms": {"answr": fake("x")}}, "InvalidInput", "role_llms has no role 'answr' (did you mean 'answer'?)"),
    ({"llm": "gpt4"}, "ModelError", "llm: unknown chat model spec 'gpt4'"),
    ({"llm": "fake:[x]"}, "ModelError", "llm: fake: expects a JSON list of strings"),
    ({"llm": fake("x"), "top_k": "five"}, "InvalidInput", "top_k must be an integer >= 1, got 'five'"),
    ({"llm": fake("x"), "corpus": "nope"}, "UnknownCorpus", "unknown corpus 'nope' in embedded://"),
    ({"llm": fake("x"), "corpus": "wiki", "store": "embedded:///no/such/store"}, "StoreNotFound",
     "no store at embedded:///no/such/store"),
])
def test_settings_that_cannot_work_are_a_422_before_the_run(client, context, error, message):
    body = rejected(client.runs.wait, None, "rag", input={"question": QUESTION}, context=context)
    assert body["error"] == error and body["message"].startswith(message), body


def test_assistants_and_their_runs_are_checked(client):
    assert rejected(client.assistants.create, graph_id="omne", context={"grph": "kg"})["message"].startswith(
        "omne has no setting(s) grph")
    assistant = client.assistants.create(graph_id="direct", context={"llm": fake("<answer>Paris</answer>")})
    body = rejected(client.runs.wait, None, assistant["assistant_id"], input={"question": "Capital?"},
                    context={"bogus": 1})
    assert body["message"].startswith("direct has no setting(s) bogus")
    body = rejected(client.runs.wait, None, assistant["assistant_id"], input={"question": "Capital?"},
                    context={"llm": "gpt4"})
    assert body["error"] == "ModelError"  # the run's settings over the assistant's count
    out = client.runs.wait(None, assistant["assistant_id"], input={"question": "Capital of France?"})
    assert out["answer"] == "Paris"


# what POST /assistants refuses: an assistant whose every run would be refused (the README's 422)
BAD_ASSISTANTS = [
    ("opera", {"role_llms": {"plann": fake("x")}}, "InvalidInput",
     "role_llms has no role 'plann' (did you mean 'plan'?)"),
    ("direct", {"llm": "gpt4"}, "ModelError", "llm: unknown chat model spec 'gpt4'"),
    ("rag", {"llm": fake("x"), "store": "embedded:///no/such/store"}, "StoreNotFound",
     "no store at embedded:///no/such/store"),
    ("rag", {"llm": fake("x"), "corpus": "nope"}, "UnknownCorpus", "unknown corpus 'nope'"),
    ("omne", {"llm": fake("x"), "top_k": "five"}, "InvalidInput", "top_k must be an integer >= 1"),
]


@pytest.mark.parametrize(("agent", "context", "error", "message"), BAD_ASSISTANTS)
def test_assistants_that_cannot_run_are_a_422(client, agent, context, error, message):
    body = rejected(client.assistants.create, graph_id=agent, context=context)
    assert body["error"] == error and body["message"].startswith(message), body
    assert not [a for a in client.assistants.search(graph_id=agent, limit=50) if a.get("context") == context]


def test_an_assistant_may_leave_its_model_to_its_runs(client):
    assistant = client.assistants.create(graph_id="rag", context={"corpus": "wiki", "top_k": 1})
    out = client.runs.wait(None, assistant["assistant_id"], input={"question": "Who directed Inception?"},
                           context={"llm": fake("<answer>Christopher Nolan</answer>")})
    assert out["answer"] == "Christopher Nolan"


@pytest.mark.parametrize(("agent", "context", "error", "message"), BAD_ASSISTANTS[:3])
def test_assistant_checks_without_a_server(agent, context, error, message):
    """The middleware's check of a POST /assistants body, in this process."""
    import asyncio

    from mhqa_graph.errors import MhqaError
    from mhqa_graph.studio import check_payload

    with pytest.raises(MhqaError) as caught:
        asyncio.run(check_payload("/assistants", {"graph_id": agent, "context": context}))
    assert type(caught.value).__name__ == error and str(caught.value).startswith(message)
    asyncio.run(check_payload("/assistants", {"graph_id": "direct", "context": {"llm": fake("x")}}))  # accepted
