"""Each design declares a spec (graphs/spec.py) and the registry holds them by agent name; the core reads a run
through its agent's spec, so a design it does not know by name is read as fully as those it ships with."""

from __future__ import annotations

import pytest
from mhqa_graph.graphs import SPECS, build_graph, context_schema, design_spec, make_context
from mhqa_graph.graphs import auto as A
from mhqa_graph.graphs.baselines import BaselineContext, build_direct
from mhqa_graph.graphs.spec import DesignSpec

from mhqa_graph import demo
from mhqa_graph.errors import InvalidInput
from mhqa_graph.eval.health import behaviour
from mhqa_graph.eval.runner import make_record
from mhqa_graph.ingest.datasets import QAItem
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.traces import PlanItem, Retrieved, Step, TraceRecorder, trace_from_state


@pytest.mark.parametrize("agent", list(SPECS))
def test_every_agent_of_the_registry_has_its_spec(agent):
    spec = SPECS[agent]
    assert isinstance(spec, DesignSpec) and spec.name == agent and design_spec(agent) is spec
    assert build_graph(agent).builder.context_schema is spec.context is context_schema(agent)
    assert spec.roles and spec.min_calls >= 1


@pytest.mark.parametrize("agent", list(SPECS))
def test_its_roles_are_the_keys_its_context_takes_in_role_llms(agent):
    roles = SPECS[agent].roles
    ctx = make_context(agent, require_source=False, llm="fake", role_llms=dict.fromkeys(roles, "fake"))
    assert tuple(ctx.role_llms) == roles
    with pytest.raises(InvalidInput, match="role_llms has no role 'critic'"):
        make_context(agent, require_source=False, llm="fake", role_llms={"critic": "fake"})


def test_an_unknown_agent_is_refused_with_the_agents_named():
    with pytest.raises(InvalidInput, match="unknown agent 'toy'; choose one of opera, mujica, omne, rag, direct, auto"):
        design_spec("toy")


def test_auto_reads_the_fewest_calls_and_its_roles_from_the_specs():
    assert {s: SPECS[s].min_calls for s in ("rag", "opera", "mujica", "omne")} == {
        "rag": 1, "opera": 3, "mujica": 3, "omne": 2}
    assert A.MIN_CALLS == {"rag": 1, "second_look": 1, "opera": 3, "mujica": 3, "omne": 2}
    assert SPECS["auto"].roles == ("answer", "plan", "analysis", "rewrite", "planner", "worker", "tool-agent")


def toy() -> DesignSpec:
    """A design the core has never heard of: direct's graph under another name, read by its own functions."""
    return DesignSpec(
        name="toy", build=build_direct, context=BaselineContext, roles=("answer",), min_calls=1,
        demo_lines=lambda output, titles: [f"toy said {output['answer']} ({', '.join(titles)})"],
        trace_parts=lambda output: ([PlanItem(id="1", question=f"Is it {output['answer']}?")],
                                    [Step(id="1", kind="look", retrieved=[Retrieved(id="t1")])], []),
        acted=lambda trace: bool(trace.steps), rates=lambda traces: {"toy_runs": len(traces)},
        record_fields=lambda output, trace: {"toy": output["answer"]}, searches=False)


def test_the_core_reads_a_design_it_does_not_know_through_its_spec(monkeypatch):
    monkeypatch.setitem(SPECS, "toy", toy())
    ctx = make_context("toy", llm=FakeChatModel(responses=["<answer>London</answer>"]))
    recorder = TraceRecorder("toy", ctx)
    out = build_graph("toy").invoke({"question": "Where?"}, context=ctx, config={"callbacks": [recorder]})
    trace = recorder.trace(out)
    assert trace.plan == [PlanItem(id="1", question="Is it London?")] and [s.kind for s in trace.steps] == ["look"]
    assert trace_from_state(out, agent="toy", question="Where?").steps == trace.steps
    item = QAItem(id="q", question="Where?", answers=("London",), supporting_titles=("Paris",))
    record = make_record(item, out, 0.1, trace)
    assert record["toy"] == "London" and record["health"]["acted"] is True
    assert behaviour([record])["toy_runs"] == 1
    assert demo.steps("toy", out, item) == ["toy said London (Paris)"]


def test_a_run_of_an_agent_no_design_declares_has_no_design_parts():
    trace = trace_from_state({"question": "q", "retrieved": [{"id": "p1"}], "tool_calls": [{"name": "x"}]},
                             agent="unknown")
    assert trace.plan == trace.steps == trace.tool_calls == []
    assert make_record(QAItem(id="q", question="q", answers=("a",)), {"answer": "a", "confidence": 0.9}, 0.1,
                       trace)["health"]["acted"] is None
