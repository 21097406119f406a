"""The agent registry: each compiled graph's nodes and edges against a snapshot, the shared run context,
the JSON schemas LangGraph Studio draws its forms from, and agents wrapped as LangChain tools.

Update the snapshots after an intended change of a graph's shape:
    MHQA_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_graph_structure.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path

import pytest
from mhqa_graph.graphs import SPECS, as_tool, build_graph, make_context
from mhqa_graph.graphs.settings import AgentContext

from mhqa_graph import Passage, open_store
from mhqa_graph.errors import InvalidInput
from mhqa_graph.testing.fakes import FakeChatModel

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("MHQA_UPDATE_SNAPSHOTS") == "1"
SHARED_FIELDS = {f.name for f in dataclasses.fields(AgentContext)}
HOW = "MHQA_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_graph_structure.py"


def structure(agent: str) -> dict:
    """Node ids and [source, target, conditional] edges of the agent's compiled graph, sorted."""
    drawn = build_graph(agent).get_graph()
    return {"nodes": sorted(drawn.nodes),
            "edges": sorted([e.source, e.target, bool(e.conditional)] for e in drawn.edges)}


def to_json(shape: dict) -> str:
    """The snapshot text: one edge a line, for readable diffs."""
    edges = ",\n".join(f"    {json.dumps(e)}" for e in shape["edges"])
    return f'{{\n  "nodes": {json.dumps(shape["nodes"])},\n  "edges": [\n{edges}\n  ]\n}}\n'


@pytest.mark.parametrize("agent", list(SPECS))
def test_graph_structure_matches_snapshot(agent):
    path = SNAPSHOTS / f"{agent}.json"
    current = structure(agent)
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(to_json(current), encoding="utf-8")
        return
    assert path.exists(), f"no snapshot of {agent}; create it with: {HOW}"
    saved = json.loads(path.read_text(encoding="utf-8"))
    if saved != current:
        changes = [f"{sign} node {n}" for sign, a, b in (("+", current, saved), ("-", saved, current))
                   for n in a["nodes"] if n not in b["nodes"]]
        changes += [f"{sign} edge {e[0]} -> {e[1]}{' (conditional)' if e[2] else ''}"
                    for sign, a, b in (("+", current, saved), ("-", saved, current))
                    for e in a["edges"] if e not in b["edges"]]
        pytest.fail(f"the {agent} graph changed shape (+ only in the graph, - only in {path}):\n  "
                    + "\n  ".join(changes)
                    + f"\nif intended, update the snapshot with: {HOW}")


@pytest.mark.parametrize("agent", list(SPECS))
def test_context_schema_extends_the_shared_context(agent):
    schema = build_graph(agent).builder.context_schema
    assert dataclasses.is_dataclass(schema) and issubclass(schema, AgentContext)
    assert SHARED_FIELDS <= {f.name for f in dataclasses.fields(schema)}
    assert schema().llm == "auto"  # every setting has a default


@pytest.mark.parametrize("agent", list(SPECS))
def test_make_context(agent):
    ctx = make_context(agent, llm="fake", corpus="wiki", top_k=None)
    assert type(ctx) is build_graph(agent).builder.context_schema
    assert (ctx.llm, ctx.corpus, ctx.top_k) == ("fake", "wiki", AgentContext.top_k)  # None keeps the default
    with pytest.raises(InvalidInput, match="no setting.*bogus"):
        make_context(agent, bogus=1)


@pytest.mark.parametrize("agent", list(SPECS))
def test_no_corpus_and_no_graph_is_refused_in_one_sentence(agent):
    """Every agent that searches the store refuses a context without a corpus or graph in make_context, in one
    sentence; `direct` needs neither (issue 64, 4)."""
    if agent == "direct":
        assert make_context(agent, llm="fake").corpus is None
        return
    with pytest.raises(InvalidInput) as caught:
        make_context(agent, llm="fake")
    assert str(caught.value) == (f"{agent} searches the store: set corpus or graph (`mhqa stats` lists them), or "
                                 "use the direct agent")
    make_context(agent, llm="fake", require_source=False)  # settings whose source comes later
    make_context(agent, llm="fake", graph="kg")


def test_unknown_agent_is_an_input_error():
    with pytest.raises(InvalidInput, match="unknown agent 'nope'; choose one of opera"):
        build_graph("nope")


@pytest.mark.parametrize("agent", list(SPECS))
def test_json_schemas_for_studio(agent):
    """LangGraph Studio renders its input form, output view and context form from these schemas."""
    graph = build_graph(agent)
    inputs = graph.get_input_jsonschema()
    assert "question" in inputs["properties"] and "question" in inputs["required"]
    assert "answer" in graph.get_output_jsonschema()["properties"]
    assert SHARED_FIELDS <= set(graph.get_context_jsonschema()["properties"])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('registry')}/s?embedder=hash")
    s.add_passages("wiki", [
        Passage("inception", "Inception", "Inception is a 2010 film directed by Christopher Nolan."),
        Passage("nolan", "Christopher Nolan", "Christopher Nolan was born in London in 1970."),
        Passage("paris", "Paris", "Paris is the capital of France.")])
    yield s
    s.close()


def test_as_tool_answers_with_the_agent(store):
    model = FakeChatModel(responses=["<answer>London</answer>"])
    tool = as_tool("rag", llm=model, store=store, corpus="wiki", top_k=2)
    assert tool.name == "rag_multihop_qa" and "rag agent" in tool.description
    assert tool.args_schema.model_json_schema()["required"] == ["question"]
    assert tool.invoke({"question": "Where was the director of Inception born?"}) == "London"
    assert asyncio.run(tool.ainvoke({"question": "Where was Nolan born?"})) == "London"
    assert len(model.calls) == 2
    prompt = model.calls[0][-1].text
    assert "Question: Where was the director of Inception born?" in prompt
    assert "[2] " in prompt and "[3] " not in prompt  # top_k reached the run


def test_as_tool_reports_a_failed_run_and_takes_a_name():
    broken = FakeChatModel(responses=[], cycle=False)  # every call raises ModelError
    tool = as_tool("direct", name="closed_book", description="Answer from memory.", llm=broken)
    assert (tool.name, tool.description) == ("closed_book", "Answer from memory.")
    assert tool.invoke({"question": "Capital of France?"}).startswith("No answer (ModelError: ")


def test_as_tool_rejects_unknown_settings():
    with pytest.raises(InvalidInput, match="no setting"):
        as_tool("opera", temperature=0.3)
