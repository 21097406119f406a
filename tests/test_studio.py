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
from mhqa_graph.graphs import SPECS, build_graph
from mhqa_graph.graphs.settings import AgentContext

from mhqa_graph.testing.endpoint import RecordingEndpoint, chat_completion

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


@pytest.fixture
def listener() -> Iterator[RecordingEndpoint]:
    """A model server no request may reach: it records what reaches it."""
    with RecordingEndpoint(chat_completion("<answer>London</answer>")) as endpoint:
        yield endpoint


SERVER_KEY = "sk-server-0123456789"  # the server's OPENAI_API_KEY: no request may send it elsewhere


@pytest.fixture(scope="module")
def allowed_listener() -> Iterator[RecordingEndpoint]:
    """A model server the operator allows requests to name (MHQA_SERVE_LLMS), without giving it the key."""
    with RecordingEndpoint(chat_completion("<answer>London</answer>")) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def server(tmp_path_factory, allowed_listener) -> Iterator[str]:
    """`langgraph dev` over langgraph.json, with MHQA_STORE set to a filled tiny store; yields its URL. Its operator
    lets requests name `allowed_listener` and stores under /no/such (to show the existence check behind it)."""
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
           "LANGSMITH_TRACING": "false", "LANGCHAIN_TRACING_V2": "false", "MHQA_STORE": uri,
           "OPENAI_API_KEY": SERVER_KEY, "MHQA_SERVE_LLMS": f"openai:{allowed_listener.url}#*",
           "MHQA_SERVE_STORES": "embedded:///no/such/*"}
    for name in ("MHQA_SERVE_ORIGINS", "MHQA_SERVE_HOSTS", "MHQA_OPENAI_KEY_URLS", "OPENAI_BASE_URL"):
        env.pop(name, None)
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
    assert sorted(a["graph_id"] for a in assistants) == sorted(SPECS)
    shared = {f.name for f in dataclasses.fields(AgentContext)}
    for assistant in assistants:
        schemas = client.assistants.get_schemas(assistant["assistant_id"])
        assert shared <= set(schemas["context_schema"]["properties"]), assistant["graph_id"]
        assert "question" in schemas["input_schema"]["properties"], assistant["graph_id"]
        assert "answer" in schemas["output_schema"]["properties"], assistant["graph_id"]


@pytest.mark.parametrize("agent", SPECS)
def test_every_context_field_has_a_description(client, agent):
    """Studio's form shows each field's description beside its label."""
    [assistant] = client.assistants.search(graph_id=agent, limit=1)
    properties = client.assistants.get_schemas(assistant["assistant_id"])["context_schema"]["properties"]
    assert {f.name for f in dataclasses.fields(build_graph(agent).builder.context_schema)} == set(properties)
    assert [name for name, field in properties.items() if len(field.get("description", "")) < 10] == []


@pytest.mark.parametrize("agent", list(SPECS))
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
    ({"llm": fake("x"), "top_k": "five"}, "InvalidInput", "top_k must be an integer from 1 to 1,000, got 'five'"),
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
    ("omne", {"llm": fake("x"), "top_k": "five"}, "InvalidInput", "top_k must be an integer from 1 to 1,000"),
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
def test_assistant_checks_without_a_server(agent, context, error, message, monkeypatch):
    """The middleware's check of a POST /assistants body, in this process."""
    import asyncio

    monkeypatch.setenv("MHQA_SERVE_STORES", "embedded:///no/such/*")

    from mhqa_graph.errors import MhqaError
    from mhqa_graph.studio import check_payload

    with pytest.raises(MhqaError) as caught:
        asyncio.run(check_payload("/assistants", {"graph_id": agent, "context": context}))
    assert type(caught.value).__name__ == error and str(caught.value).startswith(message)
    asyncio.run(check_payload("/assistants", {"graph_id": "direct", "context": {"llm": fake("x")}}))  # accepted


@pytest.mark.parametrize("agent", ["opera", "mujica", "omne", "rag", "auto"])
def test_a_run_with_no_corpus_and_no_graph_is_a_typed_refusal(agent):
    """A run of an agent that searches, with neither a corpus nor a graph, is refused before it starts with
    make_context's one sentence (a 422, not the HTTP 200 "internal error" it was); an assistant may leave them to
    its runs, as it may its model (issue 64, 4)."""
    import asyncio

    from mhqa_graph.errors import InvalidInput
    from mhqa_graph.studio import check_payload

    run = {"assistant_id": agent, "input": {"question": QUESTION}, "context": {"llm": fake("x")}}
    with pytest.raises(InvalidInput, match=f"^{agent} searches the store: set corpus or graph"):
        asyncio.run(check_payload("/runs/wait", run))
    asyncio.run(check_payload("/assistants", {"graph_id": agent, "context": {"llm": fake("x")}}))  # accepted


# -- who may call, and what a request may name (issue 65, 1) ----------------------------------------
@pytest.mark.parametrize(("headers", "refused"), [
    ({"host": "127.0.0.1:2024"}, False),  # the SDK, curl: no Origin
    ({"host": "localhost:2024", "origin": "http://localhost:2024"}, False),  # the server's own pages
    ({"host": "127.0.0.1:2024", "origin": "https://smith.langchain.com"}, False),  # LangGraph Studio
    ({"host": "127.0.0.1:2024", "origin": "https://evil.example"}, True),
    ({"host": "127.0.0.1:2024", "origin": "http://127.0.0.1:3000"}, True),  # another local page is another page
    ({"host": "evil.example:2024", "origin": "http://evil.example:2024"}, True),  # DNS rebinding
    ({"host": "evil.example:2024"}, True),
    ({"host": "[::1]:2024"}, False),
])
def test_foreign_pages_and_host_names_are_refused(monkeypatch, headers, refused):
    from mhqa_graph.errors import Forbidden
    from mhqa_graph.studio import check_client

    monkeypatch.delenv("MHQA_SERVE_ORIGINS", raising=False)
    monkeypatch.delenv("MHQA_SERVE_HOSTS", raising=False)
    if refused:
        with pytest.raises(Forbidden):
            check_client(headers)
    else:
        check_client(headers)


def test_the_operator_adds_origins_and_hosts(monkeypatch):
    from mhqa_graph.studio import check_client

    monkeypatch.setenv("MHQA_SERVE_ORIGINS", "https://app.example")
    monkeypatch.setenv("MHQA_SERVE_HOSTS", "gpu-box")
    check_client({"host": "gpu-box:2024", "origin": "https://app.example"})


@pytest.mark.parametrize(("context", "refused"), [
    ({"llm": fake("x")}, False),
    ({"llm": "auto", "role_llms": {"plan": "qwen2.5-coder-1.5b"}}, False),
    ({"llm": "llamacpp:qwen2.5-coder-0.5b?threads=2&lora=omne-pq2h"}, False),  # a shipped adapter by name
    ({"llm": "openai:http://127.0.0.1:9/v1#m"}, True),
    ({"role_llms": {"answer": "openai:https://evil.example/v1#m"}}, True),
    ({"llm": "llamacpp:/home/me/other.gguf"}, True),
    ({"llm": "llamacpp:qwen2.5-coder-0.5b?lora=/tmp/a.gguf"}, True),
    ({"llm": "llamacpp:qwen2.5-coder-0.5b?lora=file:a"}, True),  # a path, however short: the caller's to opt in to
    ({"llm": "hf:/data/model"}, True),
    ({"store": "embedded:///elsewhere/secret-store"}, True),
    ({"store": "neo4j://db:7687"}, True),
])
def test_a_request_names_only_local_models_and_the_servers_store(monkeypatch, context, refused):
    from mhqa_graph.errors import Forbidden
    from mhqa_graph.studio import check_served

    for name in ("MHQA_SERVE_LLMS", "MHQA_SERVE_STORES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MHQA_STORE", "embedded:///srv/kb")
    if refused:
        with pytest.raises(Forbidden):
            check_served(context)
    else:
        check_served(context)
    check_served({"store": "embedded:///srv/./kb/"})  # the server's own store under another spelling


def test_the_operator_allows_specs_and_stores_by_pattern(monkeypatch):
    from mhqa_graph.studio import check_served

    monkeypatch.setenv("MHQA_SERVE_LLMS", "openai:http://127.0.0.1:8000/v1#*")
    monkeypatch.setenv("MHQA_SERVE_STORES", "embedded:///srv/stores/*")
    check_served({"llm": "openai:http://127.0.0.1:8000/v1#qwen", "store": "embedded:///srv/stores/wiki"})


def post(server: str, path: str, body: dict, origin: str | None = None, method: str = "POST"):
    import httpx

    headers = {"Origin": origin} if origin else {}
    return httpx.request(method, f"{server}{path}", json=body, headers=headers, timeout=60)


def test_a_foreign_page_cannot_drive_the_server(server, listener):
    """Whatever it asks, a request from another web page is refused before the server acts on it, and a
    preflight from it is not granted."""
    import httpx

    body = {"assistant_id": "direct", "input": {"question": QUESTION}, "context": {"llm": f"openai:{listener.url}#m"}}
    for path in ("/runs/wait", "/runs/stream", "/threads", "/assistants/search"):
        response = post(server, path, body, origin="https://evil.example")
        assert response.status_code == 403 and response.json()["error"] == "Forbidden", (path, response.text)
    preflight = httpx.options(f"{server}/runs/wait", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Private-Network": "true"}, timeout=30)
    assert preflight.headers.get("access-control-allow-origin") not in ("*", "https://evil.example")
    studio = httpx.options(f"{server}/runs/wait", headers={
        "Origin": "https://smith.langchain.com", "Access-Control-Request-Method": "POST"}, timeout=30)
    assert studio.headers.get("access-control-allow-origin") == "https://smith.langchain.com"
    assert listener.seen == []


def test_a_request_cannot_name_its_own_model_url_or_store(server, listener):
    """Without an Origin (curl, a script), a run, an assistant, an assistant's update and a cron that name a model
    URL or a store the operator did not list are refused, and the listener hears nothing."""
    foreign = {"llm": f"openai:{listener.url}#m"}
    assert post(server, "/runs/wait", {"assistant_id": "direct", "input": {"question": QUESTION},
                                      "context": foreign}).status_code == 403
    assert post(server, "/runs/wait", {"assistant_id": "rag", "input": {"question": QUESTION},
                                      "context": {"llm": fake("x"), "corpus": "wiki",
                                                  "store": "embedded:///tmp/another-store"}}).status_code == 403
    assert post(server, "/runs/wait", {"assistant_id": "direct", "input": {"question": QUESTION},
                                      "config": {"configurable": foreign}}).status_code == 403
    assert post(server, "/assistants", {"graph_id": "direct", "context": foreign}).status_code == 403
    made = post(server, "/assistants", {"graph_id": "direct", "context": {"llm": fake("<answer>x</answer>")}})
    assert made.status_code == 200, made.text
    patched = post(server, f"/assistants/{made.json()['assistant_id']}", {"context": foreign}, method="PATCH")
    assert patched.status_code == 403 and patched.json()["error"] == "Forbidden"
    cron = post(server, "/runs/crons", {"assistant_id": "direct", "schedule": "* * * * *",
                                       "input": {"question": QUESTION}, "context": foreign})
    assert cron.status_code == 403
    assert listener.seen == []


def test_an_allowed_model_url_gets_no_key_the_operator_did_not_give_it(server, allowed_listener):
    """The server's operator allows one model URL (MHQA_SERVE_LLMS) but sends OPENAI_API_KEY only to OpenAI: the
    run is answered, and the request carried no key."""
    listener = allowed_listener
    out = post(server, "/runs/wait", {"assistant_id": "direct", "input": {"question": QUESTION},
                                     "context": {"llm": f"openai:{listener.url}#m", "decoding": "prompt"}})
    assert out.status_code == 200 and out.json()["answer"] == "London", out.text
    assert listener.seen and all(SERVER_KEY not in (seen["authorization"] or "") for seen in listener.seen)
