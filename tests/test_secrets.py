"""Secrets stay out of what a run records (issue 65, 2): specs and URIs in run.json, summary.json and `mhqa report`;
error bodies that echo credentials in records, traces and `ask --json`. `OPENAI_API_KEY` goes only to the base
URLs the operator configured, and a spec that holds a key is refused."""

from __future__ import annotations

import base64
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mhqa_graph.cli import app
from mhqa_graph.errors import ModelError
from mhqa_graph.models.factory import api_key_for, load_chat_model
from mhqa_graph.redaction import MASK, redact
from mhqa_graph.testing.endpoint import RecordingEndpoint, echoing_refusal

KEY = "sk-test-0123456789abcdef"
needs_openai = pytest.mark.skipif(importlib.util.find_spec("langchain_openai") is None,
                                  reason="openai: specs need langchain-openai: pip install 'mhqa-graph[openai]'")


@pytest.mark.parametrize(("text", "expected"), [
    ("openai:http://u:PASS@host/v1#m", f"openai:http://u:{MASK}@host/v1#m"),
    ("neo4j://neo4j:hunter22@db:7687", f"neo4j://neo4j:{MASK}@db:7687"),
    ("openai:http://TOKENONLY@host/v1#m", f"openai:http://{MASK}@host/v1#m"),
    ("openai:http://h/v1?api_key=abc&x=1#m", f"openai:http://h/v1?api_key={MASK}&x=1#m"),
    ("embedded:///data/kb?embedder=hash", "embedded:///data/kb?embedder=hash"),
    ("Error 401: got header Authorization: Bearer sk-abcdef123", f"Error 401: got header Authorization: Bearer {MASK}"),
    ("basic dXNlcjpwYXNz rejected", f"basic {MASK} rejected"),
    ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b"),
])
def test_redact_masks_credentials_and_leaves_the_rest(text, expected):
    assert redact(text) == expected


def test_redact_masks_the_secret_environment_values(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert redact(f"the server said: unknown key {KEY}!") == f"the server said: unknown key {MASK}!"


def test_the_key_goes_only_to_the_base_urls_the_operator_configured(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("MHQA_OPENAI_KEY_URLS", raising=False)
    assert api_key_for("https://api.openai.com/v1") == KEY
    assert api_key_for("https://api.openai.com/v1/") == KEY
    assert api_key_for("http://127.0.0.1:9999/v1") == "EMPTY"
    assert api_key_for("https://api.openai.com.evil.example/v1") == "EMPTY"
    assert api_key_for("https://u:p@api.openai.com:444/v1") == "EMPTY"  # another port is another server
    monkeypatch.setenv("MHQA_OPENAI_KEY_URLS", "http://127.0.0.1:9999/v1, https://llm.example/api")
    assert api_key_for("http://127.0.0.1:9999/v1") == KEY
    assert api_key_for("https://llm.example/api") == KEY
    assert api_key_for("https://llm.example/other") == "EMPTY"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://10.0.0.5:8000/v1")
    assert api_key_for("http://10.0.0.5:8000/v1") == KEY


@needs_openai
@pytest.mark.parametrize("query", ["api_key=sk-1", "key=sk-1", "token=abc"])
def test_a_spec_holding_a_key_is_refused_naming_the_variable(query):
    with pytest.raises(ModelError, match="OPENAI_API_KEY"):
        load_chat_model(f"openai:http://127.0.0.1:9/v1?{query}#m")


@pytest.fixture
def echo() -> Iterator[RecordingEndpoint]:
    """A model server that refuses every call and echoes the Authorization header it got."""
    with RecordingEndpoint(echoing_refusal) as endpoint:
        yield endpoint


def hotpot(path: Path) -> Path:
    row = {"id": "q1", "question": "Who directed Inception?", "answer": "Christopher Nolan",
           "context": {"title": ["Inception"], "sentences": [["Inception was directed by Christopher Nolan."]]}}
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    return path


@needs_openai
def test_an_eval_records_no_secret_of_its_spec_or_of_an_echoing_server(tmp_path, monkeypatch, echo):
    """A spec with userinfo, and a server that echoes the Authorization header it got (Basic, from the userinfo):
    run.json, summary.json, the record (error and trace) and `mhqa report` hold neither the password nor its
    encoding."""
    monkeypatch.delenv("MHQA_OPENAI_KEY_URLS", raising=False)
    spec = "openai:" + echo.url.replace("http://", "http://u:PASSWORD1@") + "#m"
    out = tmp_path / "run"
    done = CliRunner().invoke(app, ["eval", str(hotpot(tmp_path / "qa.jsonl")), "--dataset", "hotpotqa",
                                    "--agent", "direct", "--llm", spec, "--store",
                                    f"embedded://{tmp_path}/store?embedder=hash", "--out", str(out),
                                    "--model-timeout", "30"])
    assert done.exit_code == 0, done.output
    assert echo.seen, "the model server was never called"
    written = "".join(p.read_text(encoding="utf-8") for p in out.iterdir() if p.suffix in (".json", ".jsonl"))
    record = json.loads((out / "results.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert "invalid credentials" in record["error"] and MASK in record["error"]
    report = CliRunner().invoke(app, ["report", str(out)])
    basic = echo.seen[0]["authorization"]
    assert basic == "Basic " + base64.b64encode(b"u:PASSWORD1").decode()
    for text in (written, report.output):
        assert "PASSWORD1" not in text and basic.split()[1] not in text
    assert f"u:{MASK}@127.0.0.1" in json.loads((out / "run.json").read_text(encoding="utf-8"))["llm"]


@needs_openai
def test_ask_json_masks_what_a_server_echoes(tmp_path, monkeypatch, echo):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("MHQA_OPENAI_KEY_URLS", echo.url)
    done = CliRunner().invoke(app, ["ask", "Capital of France?", "--agent", "direct", "--llm", f"openai:{echo.url}#m",
                                    "--json", "--store", f"embedded://{tmp_path}/store?embedder=hash"])
    assert [s["authorization"] for s in echo.seen] == [f"Bearer {KEY}"] * len(echo.seen)  # a configured URL: the key
    assert KEY not in done.output and "invalid credentials" in done.output, done.output


@needs_openai
def test_userinfo_beside_a_key_is_refused(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("MHQA_OPENAI_KEY_URLS", "http://127.0.0.1:9/v1")
    with pytest.raises(ModelError, match="one credential") as caught:
        load_chat_model("openai:http://u:PASSWORD1@127.0.0.1:9/v1#m")
    assert "PASSWORD1" not in str(caught.value)


@needs_openai
def test_a_url_the_operator_did_not_configure_never_gets_the_key(tmp_path, monkeypatch, echo):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("MHQA_OPENAI_KEY_URLS", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    CliRunner().invoke(app, ["ask", "Capital of France?", "--agent", "direct", "--llm", f"openai:{echo.url}#m",
                             "--json", "--store", f"embedded://{tmp_path}/store?embedder=hash"])
    assert echo.seen and all(KEY not in (seen["authorization"] or "") for seen in echo.seen)
