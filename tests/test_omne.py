"""The Omne tool agent, scripted with FakeChatModel over a tiny hash-embedder store."""

import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from mhqa_graph.graphs.omne import OmneContext, build
from mhqa_graph.graphs.omne import prompts as P
from mhqa_graph.graphs.omne.graph import graph
from mhqa_graph.graphs.omne.protocol import parse_reply
from mhqa_graph.graphs.settings import AgentContext

from mhqa_graph.errors import InvalidQuestion
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel

Q = "Who is the father of the director of Inception?"
DIRECTED = "Who directed Inception?"  # one hop: Christopher Nolan is its answer


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('omne')}/s?embedder=hash")
    s.add_triples("films", [("Inception", "directed by", "Christopher Nolan"),
                            ("Christopher Nolan", "father", "Brendan Nolan"),
                            ("Titanic", "directed by", "James Cameron")])
    s.add_triples("music", [("Abbey Road", "recorded by", "The Beatles")])
    yield s
    s.close()


def call(name: str, think: str = "", **args) -> str:
    head = f"<think>{think}</think>\n" if think else ""
    return f'{head}<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def ctx(model, store, **kw) -> OmneContext:
    return OmneContext(llm=model, store=store, graph=kw.pop("graph", "films"), **kw)


def two_hop_script() -> list[str]:
    return [call("entity_matcher", think="Find the film first.", query="Inception", graph_type="films"),
            call("node_info", think="Who directed it?", entity="Inception", graph_type="films"),
            call("node_info", entity="Christopher Nolan", graph_type="films"),
            "<think>Nolan's father is Brendan Nolan.</think>\n<answer>Brendan Nolan</answer>"]


def test_a_walk_handed_its_start_spends_no_turn_on_it(store):
    """`start_from` (auto's hand-over): node_info on those entities runs before the first turn, written as the
    model's call and tagged `handed_over`; the model's turns go to the hops beyond."""
    from mhqa_graph.messages import HANDED_OVER
    from mhqa_graph.traces import TraceRecorder

    model = FakeChatModel(responses=two_hop_script()[2:], cycle=False)
    recorder = TraceRecorder("omne", None)
    out = graph.invoke({"question": Q, "start_from": ["Inception", " Inception ", ""]}, {"callbacks": [recorder]},
                       context=ctx(model, store))
    assert out["answer"] == "Brendan Nolan" and out["error"] is None
    assert out["rounds"] == 2 and len(model.calls) == 2
    assert [c["args"]["entity"] for c in out["tool_calls"]] == ["Inception", "Christopher Nolan"]
    first = model.calls[0]
    assert '<tool_call>\n{"name": "node_info", "arguments": {"entity": "Inception", "graph_type": "films"}}' \
        in first[2].text and "(Inception) -[directed by]-> (Christopher Nolan)" in first[3].text
    kinds = [m.kind for m in recorder.trace(out).llm_calls[0].messages]
    assert kinds.count(HANDED_OVER) == 1


def system_prompt(model: FakeChatModel, i: int = 0) -> str:
    first = model.calls[i][0]
    assert isinstance(first, SystemMessage)
    return first.text


def test_two_hop_answer_through_the_tools(store):
    model = FakeChatModel(responses=two_hop_script(), cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert out["answer"] == "Brendan Nolan" and out["error"] is None
    assert out["rounds"] == 4 and out["repeated_calls"] == 0
    assert [c["name"] for c in out["tool_calls"]] == ["entity_matcher", "node_info", "node_info"]
    assert out["tool_calls"][0]["result_preview"].startswith("Inception")
    assert out["tool_calls"][2]["args"] == {"entity": "Christopher Nolan", "graph_type": "films"}
    assert "(Christopher Nolan) -[father]-> (Brendan Nolan)" in out["tool_calls"][2]["result_preview"]
    # the conversation lives in state as messages: AI tool calls answered by ToolMessages with their ids
    msgs = out["messages"]
    ai_ids = [tc["id"] for m in msgs if isinstance(m, AIMessage) for tc in m.tool_calls]
    tool_ids = [m.tool_call_id for m in msgs if isinstance(m, ToolMessage)]
    assert ai_ids == tool_ids and len(ai_ids) == 3
    # and is rendered back as text: the last prompt holds every result in <tool_response> tags
    last_prompt = model.calls[-1]
    assert all(not isinstance(m, ToolMessage) for m in last_prompt)
    responses = [m.text for m in last_prompt if isinstance(m, HumanMessage) and "<tool_response>" in m.text]
    assert len(responses) == 3 and "Brendan Nolan" in responses[-1]
    assert "<tool_call>" in last_prompt[-2].text  # the model's own earlier turn, verbatim


@pytest.mark.parametrize("max_rounds", [1, 3, None])
def test_round_cap_then_one_forced_answer(store, max_rounds):
    def respond(messages):
        if P.FORCE_ANSWER in messages[-1].text:
            return "<answer>Brendan Nolan</answer>"
        return call("entity_matcher", query=f"film number {len(model.calls)}")

    model = FakeChatModel(respond=respond)
    kw = {} if max_rounds is None else {"max_rounds": max_rounds}
    out = graph.invoke({"question": Q}, context=ctx(model, store, **kw))
    cap = max_rounds or 7
    assert len(model.calls) == cap + 1 and out["rounds"] == cap
    assert len(out["tool_calls"]) == cap and out["repeated_calls"] == 0
    assert out["answer"] == "Brendan Nolan" and out["error"] == f"RoundCap: no answer within {cap} rounds"


def test_forced_answer_without_answer_tag_is_an_error(store):
    model = FakeChatModel(responses=[call("entity_matcher", query=f"q{i}") for i in range(3)])
    out = graph.invoke({"question": Q}, context=ctx(model, store, max_rounds=2))
    assert len(model.calls) == 3 and out["rounds"] == 2
    assert out["answer"] == "" and out["error"].startswith("MalformedOutput")


def test_repeated_calls_are_detected_and_not_run_again(store, monkeypatch):
    matched = []
    real = store.match_entities
    monkeypatch.setattr(store, "match_entities", lambda *a, **k: matched.append(a) or real(*a, **k))
    both = call("node_info", entity="Inception") + call("node_info", entity="Inception", graph_type="films")
    model = FakeChatModel(responses=[
        call("entity_matcher", query="Inception", graph_type="films"),
        call("entity_matcher", query="  Inception ", graph_type="films"),  # same after normalising
        call("entity_matcher", query="Inception"),  # graph_type defaults to the first graph
        both,  # the second is the same call as the first (default graph_type)
        "<answer>Christopher Nolan</answer>"], cycle=False)
    out = graph.invoke({"question": DIRECTED}, context=ctx(model, store))
    assert out["answer"] == "Christopher Nolan"
    assert [c["repeated"] for c in out["tool_calls"]] == [False, True, True, False, True]
    assert out["repeated_calls"] == 3 and len(matched) == 1
    tool_msgs = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert "already called entity_matcher" in tool_msgs[1].text and "already called node_info" in tool_msgs[4].text
    assert "Entity: Inception" in tool_msgs[3].text


def test_unknown_tool_and_wrong_argument_types_become_error_results(store):
    model = FakeChatModel(responses=[
        call("search_web", query="Inception"),
        call("entity_matcher", query=42),
        call("node_info", graph_type="films"),
        call("node_info", entity="Inception", graph_type=["films"]),
        call("node_info", entity="Inception", graph_type="books"),
        call("node_info", entity="Inceptio"),
        "<answer>Brendan Nolan</answer>"], cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert out["answer"] == "Brendan Nolan" and out["error"] is None and out["rounds"] == 7
    tool_msgs = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in tool_msgs] == ["error"] * 4 + ["success", "error"]
    texts = [m.text for m in tool_msgs]
    assert "unknown tool 'search_web'" in texts[0]
    assert 'argument "query" of entity_matcher must be a non-empty string, got 42' in texts[1]
    assert 'needs the argument "entity"' in texts[2]
    assert 'argument "graph_type" of node_info must be a string' in texts[3]
    assert texts[4].startswith("Entity: Inception")  # one graph: an invented graph_type means that graph
    assert "no entity named 'Inceptio'" in texts[5] and "closest names: Inception" in texts[5]
    assert "unknown tool 'search_web'" in model.calls[1][-1].text  # the model saw the error


@pytest.mark.parametrize("reply", [
    '<tool_call>{"name": "node_info", "arguments": {"entity": "Inception", "graph_type": "films"}}',  # no close tag
    '<tool_call>{"name": "node_info", "arguments": {"entity": "Inception"',  # cut off mid-JSON
    "<tool_call>{'name': 'node_info', 'arguments': {'entity': 'Inception',},}</tool_call>",
    '<tool_call>```json\n{"name": "node_info", "args": {"entity": "Inception"}}\n```</tool_call>',
    '<tool_call>{"name": "node_info", "parameters": {"name": "Inception"}}</tool_call>',
    '<tool_call>{"name": "node_info", "arguments": "{\\"entity\\": \\"Inception\\"}"}</tool_call>',
    '<tool_call>{"type": "function", "function": {"name": "node_info", "arguments": {"entity": "Inception"}}}'
    "</tool_call>",
    '<tool_call>{"node_info": {"entity": "Inception"}}</tool_call>',
    '<tool_call>{"name": "node_info", "entity": "Inception"}</tool_call>',
    '<think>unclosed thinking\n<tool_call>{"name": "node_info", "arguments": {"entity": "Inception"}}</tool_call>',
    'Let me look.\n{"name": "node_info", "arguments": {"entity": "Inception"}}',  # no tags at all
])
def test_malformed_tool_calls_are_read_tolerantly(store, reply):
    model = FakeChatModel(responses=[reply, "<answer>Christopher Nolan</answer>"], cycle=False)
    out = graph.invoke({"question": DIRECTED}, context=ctx(model, store))
    assert out["answer"] == "Christopher Nolan" and out["error"] is None
    assert out["tool_calls"][0]["args"] == {"entity": "Inception", "graph_type": "films"}
    assert "(Inception) -[directed by]-> (Christopher Nolan)" in out["tool_calls"][0]["result_preview"]


@pytest.mark.parametrize("reply, error", [
    ("<tool_call>this is not json</tool_call>", "not valid JSON"),
    ('<tool_call>{"arguments": {"entity": "Inception"}}</tool_call>', 'has no "name"'),
    ('<tool_call>{"name": "node_info", "arguments": [1, 2]}</tool_call>', 'must be a JSON object'),
])
def test_unreadable_tool_calls_get_an_error_result(store, reply, error):
    model = FakeChatModel(responses=[reply] + ["<answer>x</answer>"] * 2, cycle=False)  # x: in no result, sent back
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert out["answer"] == "x" and out["rounds"] == 3
    ai = out["messages"][1]
    assert not ai.tool_calls and len(ai.invalid_tool_calls) == 1 and error in ai.invalid_tool_calls[0]["error"]
    tool_msg = out["messages"][2]
    assert isinstance(tool_msg, ToolMessage) and tool_msg.status == "error" and error in tool_msg.text


def test_parse_reply_variants():
    two = parse_reply('<tool_call>[{"name": "node_info", "arguments": {"entity": "A"}}, '
                      '{"name": "node_info", "arguments": {"entity": "B"}}]</tool_call>')
    assert [c["args"]["entity"] for c in two.calls] == ["A", "B"]
    open_tags = parse_reply('<tool_call>{"name": "node_info", "arguments": {"entity": "A"}}'
                            '<tool_call>{"name": "node_info", "arguments": {"entity": "B"}}')
    assert [c["args"]["entity"] for c in open_tags.calls] == ["A", "B"]
    assert parse_reply("<think>maybe <answer>X</answer>?</think><answer> Paris\nbecause</answer>").answer == "Paris"
    assert parse_reply("<answer>  </answer>").answer is None
    chat = parse_reply("I would like to search.")
    assert chat.calls == [] and chat.answer is None and chat.kept == "I would like to search."
    assert parse_reply('{"name": "calculator", "arguments": {}}').calls == []  # bare JSON only for known tools


def test_a_model_that_only_chats_gets_one_nudge(store):
    model = FakeChatModel(responses=["Interesting question, let me consider it."])
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    # chat -> nudge -> chat -> forced answer call
    assert len(model.calls) == 3 and out["rounds"] == 2 and out["tool_calls"] == []
    assert model.calls[1][-1].text == P.NUDGE and P.NUDGE not in model.calls[2][-2].text
    assert P.FORCE_ANSWER in model.calls[2][-1].text
    assert out["answer"] == "Interesting question, let me consider it."
    assert out["error"].startswith("MalformedOutput")


def test_nudge_counts_against_the_round_cap(store):
    model = FakeChatModel(responses=["hmm", "<answer>Brendan Nolan</answer>"], cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store, max_rounds=1))
    assert len(model.calls) == 2 and out["rounds"] == 1  # no second round: straight to the forced answer
    assert P.FORCE_ANSWER in model.calls[1][-1].text and out["answer"] == "Brendan Nolan"


def test_nudge_then_the_model_recovers(store):
    model = FakeChatModel(responses=["hmm", call("node_info", entity="Christopher Nolan"),
                                     "<answer>Brendan Nolan</answer>"], cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert out["answer"] == "Brendan Nolan" and out["rounds"] == 3 and out["error"] is None


def test_graph_type_chooses_between_graphs(store):
    model = FakeChatModel(responses=[call("entity_matcher", query="Abbey Road", graph_type="music"),
                                     call("node_info", entity="Abbey Road", graph_type="music"),
                                     call("node_info", entity="Abbey Road", graph_type="films"),
                                     "<answer>The Beatles</answer>"], cycle=False)
    out = graph.invoke({"question": "Who recorded Abbey Road?"}, context=ctx(model, store, graph="films, music"))
    assert "(the graph_type argument): films, music" in system_prompt(model)
    assert '"enum": ["films", "music"]' in system_prompt(model)
    previews = [c["result_preview"] for c in out["tool_calls"]]
    assert previews[0].splitlines()[0] == "Abbey Road (1 facts: recorded by)"
    assert "(Abbey Road) -[recorded by]-> (The Beatles)" in previews[1]
    assert "no entity named 'Abbey Road' in graph 'films'" in previews[2]
    assert out["answer"] == "The Beatles"


def test_without_a_graph_setting_the_store_graphs_are_offered(store):
    model = FakeChatModel(responses=[call("node_info", entity="Abbey Road", graph_type="music"), "<answer>x</answer>"])
    out = graph.invoke({"question": "Who recorded Abbey Road?"}, context=ctx(model, store, graph=None))
    assert "(the graph_type argument): films, music" in system_prompt(model)
    assert "The Beatles" in out["tool_calls"][0]["result_preview"]


@pytest.mark.parametrize("think", [True, False])
def test_think_setting_changes_the_prompt(store, think):
    model = FakeChatModel(responses=["<answer>x</answer>"])
    graph.invoke({"question": Q}, context=ctx(model, store, think=think))
    assert (P.THINK_ON in system_prompt(model)) is think
    assert (P.THINK_OFF in system_prompt(model)) is not think


def test_topic_entities_are_in_the_first_prompt(store):
    model = FakeChatModel(responses=["<answer>x</answer>"])
    graph.invoke({"question": Q, "topic_entities": ["Inception", " "]}, context=ctx(model, store))
    first_user = model.calls[0][1].text
    assert first_user.startswith(f"Question: {Q}") and first_user.endswith("Entities the question is about: Inception")


def test_model_error_is_recorded(store):
    model = FakeChatModel(responses=[call("entity_matcher", query="Inception")], cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert out["error"].startswith("ModelError:") and "exhausted" in out["error"]
    assert out["answer"] == "" and out["rounds"] == 2 and len(out["tool_calls"]) == 1


def test_provider_exception_in_forced_answer_is_a_model_error(store):
    def respond(messages):
        if P.FORCE_ANSWER in messages[-1].text:
            raise TimeoutError("read timed out")
        return call("entity_matcher", query="Inception")

    out = graph.invoke({"question": Q}, context=ctx(FakeChatModel(respond=respond), store, max_rounds=1,
                                                    retry_backoff=0.0))
    assert out["error"] == "ModelError: model call failed after 3 attempts: TimeoutError: read timed out"


@pytest.mark.parametrize("question", ["", "   \n", 42, None])
def test_invalid_question_is_the_callers_error(store, question):
    model = FakeChatModel(responses=["<answer>x</answer>"])
    with pytest.raises(InvalidQuestion):
        graph.invoke({"question": question}, context=ctx(model, store))
    assert model.calls == []


def test_stream_updates_one_per_step(store):
    model = FakeChatModel(responses=two_hop_script(), cycle=False)
    updates = list(graph.stream({"question": Q}, context=ctx(model, store), stream_mode="updates"))
    assert [next(iter(u)) for u in updates] == ["start"] + ["agent", "tools"] * 3 + ["agent", "finish"]
    assert updates[2]["tools"]["tool_calls"][0]["name"] == "entity_matcher"
    assert updates[-2]["agent"]["answer"] == "Brendan Nolan"


class Interrupted(BaseException):
    """Like KeyboardInterrupt: not a model failure, so it is not turned into a ModelError."""


def test_sqlite_checkpoint_and_resume(store, tmp_path):
    script = two_hop_script()
    seen: list[str] = []

    def respond(messages):
        seen.append(messages[-1].text)
        if len(seen) == 3:
            raise Interrupted()
        return script[len(seen) - 1 - (len(seen) > 3)]

    model = FakeChatModel(respond=respond)
    config = {"configurable": {"thread_id": "t1"}}
    with SqliteSaver.from_conn_string(str(tmp_path / "ckpt.sqlite")) as saver:
        app = build(checkpointer=saver)
        with pytest.raises(Interrupted):
            app.invoke({"question": Q}, config, context=ctx(model, store))
        assert app.get_state(config).next == ("agent",)
        out = app.invoke(None, config, context=ctx(model, store))
        assert out["answer"] == "Brendan Nolan" and out["rounds"] == 4
        assert len(model.calls) == 5  # two turns before the interruption were not redone
        assert [c["repeated"] for c in out["tool_calls"]] == [False] * 3
        # a new question on the same thread starts a fresh conversation
        model2 = FakeChatModel(responses=["<answer>James Cameron</answer>"])
        out2 = app.invoke({"question": "Who directed Titanic?"}, config, context=ctx(model2, store))
        # (an answer no tool result holds is sent back once, then taken)
        assert out2["answer"] == "James Cameron" and out2["tool_calls"] == [] and out2["rounds"] == 2
        assert len(out2["messages"]) == 4 and len(model2.calls[0]) == 2


def test_dict_and_plain_agent_context(store):
    model = FakeChatModel(responses=two_hop_script())
    out = graph.invoke({"question": Q}, context={"llm": model, "store": store, "graph": "films", "max_rounds": 2,
                                                 "think": False})
    assert out["rounds"] == 2 and len(model.calls) == 3 and P.THINK_OFF in system_prompt(model)
    model = FakeChatModel(responses=two_hop_script(), cycle=False)
    out = graph.invoke({"question": Q}, context=AgentContext(llm=model, store=store, graph="films"))
    assert out["answer"] == "Brendan Nolan"


def test_role_llm_override(store):
    default = FakeChatModel(responses=["<answer>wrong</answer>"])
    agent = FakeChatModel(responses=["<answer>right</answer>"])
    out = graph.invoke({"question": Q}, context=ctx(default, store, role_llms={"tool-agent": agent}))
    assert out["answer"] == "right" and default.calls == []


def test_calls_per_turn_are_capped(store):
    three = "".join(call("node_info", entity=e) for e in ("Inception", "Titanic", "James Cameron"))
    model = FakeChatModel(responses=[three, "<answer>x</answer>"], cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store, max_calls_per_round=2))
    previews = [c["result_preview"] for c in out["tool_calls"]]
    assert previews[0].startswith("Entity: Inception") and previews[1].startswith("Entity: Titanic")
    assert previews[2].startswith("Error: at most 2 tool calls per turn")


def test_store_failures_are_recorded_not_raised():
    from mhqa_graph.errors import StoreUnavailable
    from mhqa_graph.store.base import KnowledgeStore

    class DownStore(KnowledgeStore):
        uri, backend = "down://", "down"

        def close(self): pass

        def _down(self, *args, **kwargs):
            raise StoreUnavailable("connection refused")

        _add_triples = _add_passages = _match_entities = _node_info = _search = _passages = _stats = \
            _collection_names = _down

    model = FakeChatModel(responses=[call("entity_matcher", query="Inception"), "<answer>x</answer>"])
    out = graph.invoke({"question": Q}, context=OmneContext(llm=model, store=DownStore()))  # graphs from the store
    assert out["error"] == "StoreUnavailable: connection refused" and model.calls == []
    out = graph.invoke({"question": Q}, context=OmneContext(llm=model, store=DownStore(), graph="films"))
    assert out["tool_calls"][0]["result_preview"] == "Error: connection refused" and out["answer"] == "x"
    out = graph.invoke({"question": Q}, context=OmneContext(llm=model, store="bogus://x", graph="films"))
    assert out["tool_calls"][0]["result_preview"].startswith("Error: 'bogus://x': scheme must be")


def test_zero_rounds_is_one_forced_answer(store):
    model = FakeChatModel(responses=["<answer>Brendan Nolan</answer>"])
    out = graph.invoke({"question": Q}, context=ctx(model, store, max_rounds=0))
    assert out["answer"] == "Brendan Nolan" and out["rounds"] == 0 and len(model.calls) == 1
    assert P.FORCE_ANSWER in model.calls[0][-1].text


def test_schemas_for_studio():
    assert set(graph.get_input_jsonschema()["properties"]) == {"question", "topic_entities", "start_from"}
    assert {"answer", "error", "rounds", "tool_calls", "repeated_calls", "messages"} <= set(
        graph.get_output_jsonschema()["properties"])
    assert {"graph", "max_rounds", "think", "max_calls_per_round"} <= set(graph.get_context_jsonschema()["properties"])
