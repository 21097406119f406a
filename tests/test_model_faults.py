"""Environment faults: model calls that time out or fail with HTTP 5xx / connection errors are retried with
backoff, then end as a typed ModelError recorded for the question; a real loopback HTTP server stands in
for an openai-compatible endpoint; Neo4j refusing the credentials is a clear StoreUnavailable."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from mhqa_graph.graphs.calls import ask, ask_json, get_llm, is_transient
from mhqa_graph.graphs.settings import AgentContext
from neo4j.exceptions import AuthError

from mhqa_graph.errors import ModelError, StoreUnavailable
from mhqa_graph.eval import run_eval
from mhqa_graph.replies import ReplyFormat
from mhqa_graph.store.neo4j_backend import Neo4jStore
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.testing.recording_driver import RecordingDriver
from mhqa_graph.traces import TraceRecorder
from neo4j import Driver

HAS_OPENAI = importlib.util.find_spec("langchain_openai") is not None
MESSAGES = [SystemMessage("Answer briefly."), HumanMessage("Capital of France?")]


def failing(times: int, exc: BaseException, reply: str = "Paris") -> FakeChatModel:
    """A model whose first `times` calls raise `exc` (all calls if times < 0), then replies `reply`."""
    def respond(messages):
        if times < 0 or len(model.calls) <= times:
            raise exc
        return reply

    model = FakeChatModel(respond=respond)
    return model


def context(model, **kw) -> AgentContext:
    return AgentContext(role_llms={"answer": model}, **{"retry_backoff": 0.01, **kw})


def _request() -> httpx.Request:
    return httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")


def _status(code: int) -> httpx.Response:
    return httpx.Response(code, request=_request())


def transient_errors() -> list[BaseException]:
    errors: list[BaseException] = [TimeoutError("read timed out"), ConnectionResetError("reset by peer"),
                                   httpx.ConnectError("refused", request=_request()),
                                   httpx.ReadTimeout("slow", request=_request())]
    if HAS_OPENAI:
        import openai

        errors += [openai.APITimeoutError(request=_request()),
                   openai.APIConnectionError(request=_request()),
                   openai.InternalServerError("boom", response=_status(500), body=None),
                   openai.RateLimitError("slow down", response=_status(429), body=None)]
    return errors


def permanent_errors() -> list[BaseException]:
    errors: list[BaseException] = [ValueError("bad input"), RuntimeError("CUDA out of memory")]
    if HAS_OPENAI:
        import openai

        errors += [openai.BadRequestError("bad request", response=_status(400), body=None),
                   openai.AuthenticationError("bad key", response=_status(401), body=None)]
    return errors


# -- retry policy ----------------------------------------------------------------------------------
@pytest.mark.parametrize("exc", transient_errors(), ids=lambda e: type(e).__name__)
def test_transient_failures_are_retried_then_answer(exc):
    assert is_transient(exc)
    model = failing(2, exc)
    assert ask(get_llm(context(model), "answer"), MESSAGES) == "Paris"
    assert len(model.calls) == 3


@pytest.mark.parametrize("exc", permanent_errors(), ids=lambda e: type(e).__name__)
def test_permanent_failures_are_not_retried(exc):
    assert not is_transient(exc)
    model = failing(-1, exc)
    with pytest.raises(ModelError, match=f"^model call failed: {type(exc).__name__}: "):
        ask(get_llm(context(model), "answer"), MESSAGES)
    assert len(model.calls) == 1


def test_model_errors_of_our_own_pass_through_unretried():
    model = FakeChatModel(responses=[], cycle=False)  # raises ModelError("... exhausted ...")
    with pytest.raises(ModelError, match="exhausted"):
        ask(get_llm(context(model), "answer"), MESSAGES)
    assert len(model.calls) == 1


def test_always_failing_model_is_a_model_error_after_bounded_attempts_with_backoff():
    model = failing(-1, TimeoutError("read timed out"))
    ctx = context(model, model_retries=3, retry_backoff=0.05)
    start = time.monotonic()
    with pytest.raises(ModelError, match=r"^model call failed after 4 attempts: TimeoutError: read timed out$"):
        ask(get_llm(ctx, "answer"), MESSAGES)
    took = time.monotonic() - start
    assert len(model.calls) == 4
    # waits of 0.05, 0.1 and 0.2 s, each plus up to 0.05 s of jitter
    assert 0.35 <= took < 0.35 + 3 * 0.05 + 0.5


def test_retries_can_be_turned_off():
    model = failing(-1, ConnectionError("down"))
    with pytest.raises(ModelError, match=r"after 1 attempt: ConnectionError: down"):
        ask(get_llm(context(model, model_retries=0), "answer"), MESSAGES)
    assert len(model.calls) == 1


def test_ask_json_retries_the_call_not_the_repair():
    model = failing(1, TimeoutError("slow"), reply='{"answer": "Paris"}')
    parsed = ask_json(get_llm(context(model), "answer"), MESSAGES, ReplyFormat("answer"), dict, lambda v: v["answer"])
    assert (parsed.value, parsed.error, parsed.raw) == ("Paris", None, ['{"answer": "Paris"}'])
    assert len(model.calls) == 2


def test_every_attempt_is_traced_with_its_role():
    model = failing(2, TimeoutError("slow"))
    recorder = TraceRecorder("direct")
    reply = get_llm(context(model), "answer").invoke(MESSAGES, config={"callbacks": [recorder]})
    assert reply.text == "Paris"
    assert [(c.role, c.error) for c in recorder.calls] == [
        ("answer", "TimeoutError: slow"), ("answer", "TimeoutError: slow"), ("answer", None)]


def test_retry_settings_are_run_settings():
    ctx = AgentContext(**{"model_retries": 4, "retry_backoff": 0.0})  # as Studio sends them
    assert get_llm(AgentContext(role_llms={"plan": FakeChatModel()}, model_retries=4), "plan").max_attempt_number == 5
    assert (ctx.model_retries, ctx.retry_backoff) == (4, 0.0)
    assert (AgentContext.model_retries, AgentContext.retry_backoff) == (2, 0.5)


# -- an eval goes on ---------------------------------------------------------------------------------
def test_eval_records_the_timeout_of_one_question_and_answers_the_others(tmp_path: Path):
    rows = {f"q{i}": (f"Which city is number {i}?", f"City{i}") for i in range(1, 6)}
    data = tmp_path / "five.jsonl"
    with data.open("w", encoding="utf-8") as f:
        for rid, (question, answer) in rows.items():
            f.write(json.dumps({"id": rid, "question": question, "answer": answer, "type": "bridge",
                                "level": "easy", "supporting_facts": {"title": [rid], "sent_id": [0]},
                                "context": {"title": [rid], "sentences": [[f"{question} {answer}."]]}}) + "\n")
    attempts = {rid: 0 for rid in rows}
    lock = threading.Lock()

    def respond(messages):
        rid = next(r for r, (q, _) in rows.items() if q in messages[-1].text)
        with lock:
            attempts[rid] += 1
        if rid == "q3":
            raise TimeoutError("read timed out")
        return f"<answer>{rows[rid][1]}</answer>"

    start = time.monotonic()
    summary = run_eval("direct", "hotpotqa", data, None, f"embedded://{tmp_path}/s?embedder=hash", tmp_path / "run",
                       concurrency=5, progress=False,
                       context_overrides={"llm": FakeChatModel(respond=respond), "retry_backoff": 0.01})
    assert time.monotonic() - start < 20
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "run" / "results.jsonl").read_text().splitlines())}
    assert sorted(records) == sorted(rows) and summary.n == 5
    bad = records.pop("q3")
    assert bad["error"] == "ModelError: model call failed after 3 attempts: TimeoutError: read timed out"
    assert bad["prediction"] == "" and bad["llm_calls"] == 3 and attempts["q3"] == 3
    assert all(r["error"] is None and r["em"] == 1.0 for r in records.values())
    assert all(attempts[rid] == 1 for rid in records)


# -- a real openai-compatible endpoint on the loopback interface --------------------------------------
class Endpoint:
    """A local HTTP server answering /v1/chat/completions by `mode`: ok, 500, 400 or slow (sleeps `delay`)."""

    def __init__(self) -> None:
        self.mode, self.delay, self.requests = "ok", 1.0, []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                endpoint.requests.append(body)
                if endpoint.mode == "slow":
                    time.sleep(endpoint.delay)
                status = {"ok": 200, "slow": 200, "500": 500, "400": 400}[endpoint.mode]
                reply = {"error": {"message": f"status {status}", "type": "server_error"}}
                if status == 200:
                    reply = {"id": "c1", "object": "chat.completion", "created": 0, "model": body.get("model", ""),
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": "Paris"}}],
                             "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}}
                data = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout) and closed the connection
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def endpoint(monkeypatch):
    if not HAS_OPENAI:
        pytest.skip("langchain-openai is not installed (pip install 'mhqa-graph[openai]')")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # loopback only
    server = Endpoint()
    yield server
    server.close()


def test_openai_endpoint_answers_with_our_token_limit_and_timeout(endpoint):
    from mhqa_graph.models.factory import REQUEST_TIMEOUT_S, load_chat_model

    ctx = AgentContext(llm=f"openai:{endpoint.url}#tiny", max_new_tokens=17, retry_backoff=0.01)
    assert ask(get_llm(ctx, "answer"), MESSAGES) == "Paris"
    body = endpoint.requests[0]
    assert body["model"] == "tiny" and body.get("max_completion_tokens", body.get("max_tokens")) == 17
    model = load_chat_model(f"openai:{endpoint.url}#tiny")
    assert (model.request_timeout, model.max_retries) == (REQUEST_TIMEOUT_S, 0)  # we retry, not the client


def test_openai_endpoint_500_is_retried_then_a_model_error(endpoint):
    endpoint.mode = "500"
    ctx = AgentContext(llm=f"openai:{endpoint.url}#tiny-500", retry_backoff=0.01)
    failed = r"^model call failed after 3 attempts: \w*(InternalServer|API)Error: Error code: 500"
    with pytest.raises(ModelError, match=failed):
        ask(get_llm(ctx, "answer"), MESSAGES)
    assert len(endpoint.requests) == 3


def test_openai_endpoint_400_is_not_retried(endpoint):
    endpoint.mode = "400"
    ctx = AgentContext(llm=f"openai:{endpoint.url}#tiny-400", retry_backoff=0.01)
    with pytest.raises(ModelError, match=r"^model call failed: \w*(BadRequest|InvalidRequest)Error: Error code: 400"):
        ask(get_llm(ctx, "answer"), MESSAGES)
    assert len(endpoint.requests) == 1


def test_openai_endpoint_timeout_is_retried_and_bounded(endpoint):
    from mhqa_graph.models.factory import load_chat_model

    endpoint.mode, endpoint.delay = "slow", 1.0
    model = load_chat_model(f"openai:{endpoint.url}#tiny", timeout=0.2)
    start = time.monotonic()
    with pytest.raises(ModelError, match=r"^model call failed after 3 attempts: \w*TimeoutError: "):
        ask(get_llm(context(model), "answer"), MESSAGES)
    assert time.monotonic() - start < 3 * 0.2 + 2.0
    assert len(endpoint.requests) == 3


# -- Neo4j refusing the credentials -------------------------------------------------------------------
def test_neo4j_wrong_credentials_are_store_unavailable_at_once(monkeypatch):
    from mhqa_graph.store import neo4j_backend

    refused = AuthError("The client is unauthorized due to authentication failure.")
    driver = RecordingDriver(connect_error=refused)
    monkeypatch.setattr(neo4j_backend.GraphDatabase, "driver", lambda *args, **kwargs: driver)
    start = time.monotonic()
    with pytest.raises(StoreUnavailable, match="NEO4J_USER / NEO4J_PASSWORD") as info:
        Neo4jStore.from_uri("neo4j://127.0.0.1:7687")
    assert time.monotonic() - start < 5 and driver.closed
    assert isinstance(info.value.__cause__, AuthError)


def test_neo4j_credentials_refused_mid_run_are_store_unavailable():
    driver = RecordingDriver(lambda query, params: [])
    store = Neo4jStore(cast(Driver, driver), embedder="hash:64")

    def refuse(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        raise AuthError("credentials expired")

    driver.responder = refuse
    with pytest.raises(StoreUnavailable, match="unavailable"):
        store.stats()
