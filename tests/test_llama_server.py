"""llama.cpp's own server (mhqa_graph/models/server.py): a real `llama-server` on loopback with the tiny
smollm2-135m pack, for the wiring only (the model cannot follow the agents' formats): the `?slots=N` spec,
start and stop, concurrent calls, what the prompt cache saved, grammars, and typed errors when the binary
is missing or the server dies. The real-server tests skip only when the binary is not built
(`bash scripts/llama_server.sh`; scripts/install.sh builds it for CI, and .ci/run sets
MHQA_REQUIRE_LLAMA_SERVER=1 so that there they fail instead)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from mhqa_graph.training.rollouts import check_policy_faults  # noqa: E402

from mhqa_graph.errors import ModelError, ModelNotInstalled, TrainingError
from mhqa_graph.models import server as srv
from mhqa_graph.models.factory import check_chat_spec, load_chat_model
from mhqa_graph.models.packs import pack_installed
from mhqa_graph.replies import answer_reply, decoding_kwargs

SPEC = "llamacpp:smollm2-135m?slots=2&ctx=1024&threads=1"


def _extras_missing() -> str | None:
    try:
        import langchain_openai  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        return f"needs the openai and llamacpp extras ({exc})"
    return None if pack_installed("smollm2-135m") else "needs the smollm2-135m pack (extra models)"


def _why_not() -> str | None:
    try:
        srv.find_binary()
    except ModelNotInstalled:
        return "llama-server is not built: bash scripts/llama_server.sh"
    return _extras_missing()


WHY_NOT = None if os.environ.get("MHQA_REQUIRE_LLAMA_SERVER") == "1" else _why_not()


def real(test):
    """A test against the real server: a real model (slow), skipped only where it cannot run."""
    return pytest.mark.slow(pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))(test))


@pytest.fixture(scope="module")
def model():
    """A model on the shared server of SPEC (one server process; started again if a test killed it)."""
    yield lambda **kwargs: load_chat_model(SPEC, max_new_tokens=kwargs.pop("max_new_tokens", 8), **kwargs)
    pids = [s.pid for s in list(srv._live)]
    srv.stop_all()
    assert all(_gone(pid) for pid in pids if pid)  # no orphan left behind


def _gone(pid: int) -> bool:
    """No such process, or only its exit status is left (a zombie whose parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@real
def test_the_slots_spec_starts_one_shared_server_that_stops_cleanly(model):
    first, second = model(), model(max_new_tokens=4)
    server = first._server
    assert server is second._server and server.alive and server.slots == 2
    assert server.spec == f"openai:http://127.0.0.1:{server.port}/v1#smollm2-135m"
    reply = first.invoke("Say hello.")
    assert reply.text and reply.response_metadata["decoding"] == "prompt"
    pid = server.pid
    srv.stop_all()  # the next test's model() starts it again
    assert not server.alive and _gone(pid)
    with srv.LlamaServer("smollm2-135m", n_ctx=256, n_threads=1) as other:  # one started by hand
        assert other.chat_model(max_new_tokens=2).invoke("Hi").usage_metadata["output_tokens"] <= 2
        other_pid = other.pid
    assert not other.alive and _gone(other_pid)


@real
def test_two_concurrent_calls_finish_and_the_cache_saves_the_shared_prefix(model):
    llm = model()
    system = "You answer in one word. " + " ".join(f"Rule {i}: be brief." for i in range(60))
    replies: dict[int, object] = {}

    def call(n: int) -> None:
        replies[n] = llm.invoke([SystemMessage(system), HumanMessage(f"What is {n} + {n}?")])

    threads = [threading.Thread(target=call, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(replies) == [1, 2] and all(r.text for r in replies.values())
    again = llm.invoke([SystemMessage(system), HumanMessage("What is 3 + 3?")])
    usage = again.usage_metadata
    assert usage["input_tokens"] > 150
    assert 150 < usage["input_token_details"]["cache_read"] < usage["input_tokens"]  # the system prompt only


@real
def test_grammar_roles_are_constrained_by_the_server(model):
    llm = model(max_new_tokens=96)
    kwargs, how = decoding_kwargs(llm, answer_reply("answer"))
    assert how == "grammar"
    reply = llm.invoke("Who wrote Hamlet?", **kwargs)
    assert re.fullmatch(r"<answer>[^<\n]{1,200}</answer>", reply.text), reply.text
    assert reply.response_metadata["decoding"] == "grammar"
    refused = llm.invoke("Who wrote Hamlet?", max_new_tokens=4, grammar='root ::= ("')  # not GBNF
    assert refused.response_metadata["decoding"] == "prompt"
    assert "refused the grammar" in refused.response_metadata["decoding_error"]


@real
def test_a_server_that_dies_raises_a_typed_error_with_its_log(model):
    llm = model()
    server = llm._server
    os.kill(server.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(srv.LlamaServerError, match="killed by signal 9") as caught:
        llm.invoke("Hello")
    assert "slot" in caught.value.log and caught.value.log in str(caught.value)  # its log's last lines
    assert llm.backend_fault.startswith("llama-server died")
    with pytest.raises(TrainingError, match="llama-server died"):  # a trainer stops rather than learn from it
        check_policy_faults([llm])
    fresh = model()
    assert fresh.invoke("Hello").text and fresh.backend_fault is None  # the shared server is started again


CHILD = f"""
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with SIGINT ignored
from mhqa_graph.models.factory import load_chat_model
print(load_chat_model({SPEC!r})._server.pid, flush=True)
time.sleep(120)
"""


@real
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_no_server_outlives_its_process(sig):
    """Ctrl-C ends the process through atexit, which stops the server; a killed process takes it along
    (the server dies with the thread that started it)."""
    srv.stop_all()  # one model process at a time; the module's model() starts it again
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(child.stdout.readline())
        child.send_signal(sig)
        child.wait(30)
        deadline = time.monotonic() + 15
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(pid)
    finally:
        child.kill()
        child.wait()


def test_a_missing_binary_is_a_typed_error_with_the_install_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("MHQA_LLAMA_SERVER", str(tmp_path / "no-such-llama-server"))
    with pytest.raises(srv.LlamaServerNotInstalled, match="scripts/llama_server.sh"):
        srv.find_binary()
    monkeypatch.delenv("MHQA_LLAMA_SERVER")
    monkeypatch.setattr(srv, "built_binary", lambda: tmp_path / "llama-server")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ModelNotInstalled, match="scripts/llama_server.sh"):
        srv.LlamaServer(tmp_path / "m.gguf").start()
    with pytest.raises(ModelError, match="slots must be a positive integer"):
        check_chat_spec("llamacpp:smollm2-135m?slots=0")
    if _extras_missing() is None:
        with pytest.raises(ModelNotInstalled, match="scripts/llama_server.sh"):
            check_chat_spec(SPEC)  # before anything loads


def test_a_server_that_cannot_start_raises_a_typed_error_with_its_last_lines(tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'loading model' >&2\necho 'error: unknown model architecture' >&2\nexit 3\n")
    fake.chmod(0o755)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    server = srv.LlamaServer(gguf, binary=fake)
    with pytest.raises(srv.LlamaServerError, match="exit status 3") as caught:
        server.start()
    assert "unknown model architecture" in caught.value.log and not server.alive
    assert server not in srv._live
    with pytest.raises(ModelError, match="at least one slot"):
        srv.LlamaServer(gguf, slots=0)
