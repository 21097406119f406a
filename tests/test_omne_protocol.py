"""Omne's tool-call protocol rules, scripted: stop sequences, every call of a turn read, calls over answers,
invented results dropped and counted, context budgeting, tool results as the paper describes them,
typed errors for models that never walk the graph, and native tool calling (scripted and over HTTP)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from mhqa_graph.graphs.omne import OmneContext
from mhqa_graph.graphs.omne import prompts as P
from mhqa_graph.graphs.omne.graph import graph
from mhqa_graph.graphs.omne.protocol import canonical_reply, parse_reply

from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel, FakeToolCallingModel
from mhqa_graph.tools import open_relations
from mhqa_graph.types import Fact, NodeInfo

Q = "Who is the father of the director of Inception?"
FATHER = "(Christopher Nolan) -[father]-> (Brendan Nolan)"
DIRECTED = "Who directed Inception?"  # one hop: Christopher Nolan is its answer


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('omne-protocol')}/s?embedder=hash")
    s.add_triples("films", [("Inception", "directed by", "Christopher Nolan"),
                            ("Christopher Nolan", "father", "Brendan Nolan"),
                            *[(who, f"award number {i}", f"Award {i} " + "x" * 60) for i in range(60)
                              for who in ("Christopher Nolan", "Emma Thomas", "Syncopy")]])
    yield s
    s.close()


def call(name: str, **args) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def ctx(model, store, **kw) -> OmneContext:
    return OmneContext(llm=model, store=store, graph="films", **kw)


class StopRecordingFake(FakeChatModel):
    stops: list = []

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.stops.append(stop)
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def test_every_model_call_stops_at_tool_response(store):
    model = StopRecordingFake(responses=[call("node_info", entity="Inception")], stops=[])
    graph.invoke({"question": Q}, context=ctx(model, store, max_rounds=1))
    assert model.stops == [P.STOP, P.STOP] == [["<tool_response>"]] * 2  # the agent turn and the forced answer


def test_calls_win_over_an_answer_in_the_same_turn(store):
    reply = "<think>Look it up.</think>" + call("node_info", entity="Inception") + "<answer>1885</answer>"
    model = FakeChatModel(responses=[reply, "<answer>Christopher Nolan</answer>"], cycle=False)
    out = graph.invoke({"question": DIRECTED}, context=ctx(model, store))
    assert out["answer"] == "Christopher Nolan" and out["dropped_answers"] == 1
    assert out["tool_calls"][0]["args"]["entity"] == "Inception"
    assert "1885" not in model.calls[1][2].text  # the dropped answer never reaches the conversation


def test_invented_results_never_enter_the_conversation(store):
    """What a small model writes without a stop sequence: a call, the result it imagines, an answer."""
    reply = ("<think>Find the film.</think>" + call("node_info", entity="Inception")
             + '<tool_response>\n{"director": "Steven Spielberg"}\n</tool_response>\n<answer>Spielberg</answer>')
    model = FakeChatModel(responses=[reply, "<answer>Christopher Nolan</answer>"], cycle=False)
    out = graph.invoke({"question": DIRECTED}, context=ctx(model, store))
    assert out["invented_results"] == 1 and out["dropped_answers"] == 0
    shown = "\n".join(m.text for m in model.calls[1])
    assert "Spielberg" not in shown and "(Inception) -[directed by]-> (Christopher Nolan)" in shown
    assert out["answer"] == "Christopher Nolan"


def test_a_call_written_as_a_tool_response_is_invented_not_run(store):
    """The reply seen from qwen2.5-coder-1.5b: the call inside <tool_response>, its result and an answer."""
    reply = ('<think>I should match the entity.</think>\n<tool_response>{"name": "entity_matcher", "arguments": '
             '{"query": "Inception"}}</tool_response>\nInception was directed by Nolan.\n<answer>1885</answer>')
    parsed = parse_reply(reply)
    assert parsed.calls == [] and parsed.answer is None and parsed.invented == 1
    assert parsed.kept == "<think>I should match the entity.</think>"
    script = [reply, call("node_info", entity="Inception"), "<answer>Christopher Nolan</answer>"]
    model = FakeChatModel(responses=script, cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert model.calls[1][-1].text == P.NUDGE and out["invented_results"] == 1
    assert out["answer"] == "Christopher Nolan" and out["error"] is None


def test_all_calls_of_a_turn_are_read():
    tagged = parse_reply(call("node_info", entity="A") + "\n" + call("node_info", entity="B"))
    bare = parse_reply('{"name": "node_info", "arguments": {"entity": "A"}}\n'
                       '{"name": "entity_matcher", "arguments": {"query": "B"}} and then I answer <answer>C</answer>')
    listed = parse_reply('[{"name": "node_info", "arguments": {"entity": "A"}}, '
                         '{"name": "node_info", "arguments": {"entity": "B"}}]')
    for reply in (tagged, bare, listed):
        assert [next(iter(c["args"].values())) for c in reply.calls] == ["A", "B"]
    assert bare.answer is None and bare.dropped_answer and "<answer>" not in bare.kept
    assert bare.kept.endswith('{"query": "B"}}')  # the text after the last call is not kept


def test_ten_kilobytes_of_json_end_within_the_round_cap(store):
    junk = json.dumps({"name": "node_info", "arguments": {"entity": "x" * 10_000}})
    model = FakeChatModel(responses=[junk])
    out = graph.invoke({"question": Q}, context=ctx(model, store, max_rounds=3))
    assert out["rounds"] <= 3 and out["error"].startswith("MalformedOutput")
    assert all(len(c["result_preview"]) <= 200 for c in out["tool_calls"])


def test_a_model_looping_on_one_call_ends_with_round_cap(store):
    model = FakeChatModel(responses=[call("node_info", entity="Inception")])
    out = graph.invoke({"question": Q}, context=ctx(model, store, max_rounds=4))
    assert out["rounds"] == 4 and out["repeated_calls"] == 3
    assert out["error"].startswith("MalformedOutput") and "4 rounds" in out["error"]
    assert len(out["messages"]) > 4  # the partial conversation is kept


def test_a_model_that_never_calls_a_tool_gets_no_tool_call_error(store):
    model = FakeChatModel(responses=["<think>I know this.</think><answer>Brendan Nolan</answer>"])
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert out["answer"] == "Brendan Nolan" and out["error"].startswith("NoToolCall")


def test_unknown_tools_only_is_no_tool_call(store):
    model = FakeChatModel(responses=[call("web_search", query="Inception"), "<answer>x</answer>", "<answer>x</answer>"],
                          cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert out["error"].startswith("NoToolCall") and "unknown tool" in out["tool_calls"][0]["result_preview"]


def test_an_answer_no_result_holds_is_sent_back_once(store):
    """qwen2.5-coder-1.5b on PQ-3H answered 'lyon' (the prompt example's answer) right after entity_matcher."""
    model = FakeChatModel(responses=[call("entity_matcher", query="Inception"), "<answer>lyon</answer>",
                                     call("node_info", entity="Inception"), "<answer>Christopher Nolan</answer>"],
                          cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert "'lyon' is not in any fact you were sent" in model.calls[2][-1].text
    assert out["answer"] == "Christopher Nolan" and out["error"] is None and out["rounds"] == 4


def test_node_info_is_capped_with_the_facts_the_question_asks_for_first(store):
    model = FakeChatModel(responses=[call("node_info", entity="Christopher Nolan"), "<answer>x</answer>"], cycle=False)
    graph.invoke({"question": Q}, context=ctx(model, store, result_chars=600))
    result = model.calls[1][-1].text
    body = result.split("<tool_response>\n")[1].split("\n</tool_response>")[0]
    # "father" and "director" are in the question
    assert len(body) <= 600
    assert set(body.splitlines()[1:3]) == {f"- {FATHER}", "- (Inception) -[directed by]-> (Christopher Nolan)"}
    assert body.endswith("more facts not shown")


def test_entity_matcher_describes_each_entity(store):
    model = FakeChatModel(responses=[call("entity_matcher", query="Christopher Nolan"), "<answer>x</answer>"],
                          cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    first = out["tool_calls"][0]["result_preview"].splitlines()[0]
    assert first.startswith("Christopher Nolan (62 facts: father, ")  # the relation the question asks first


def test_a_name_copied_with_its_description_still_finds_the_node(store):
    model = FakeChatModel(responses=[call("node_info", entity="Christopher Nolan (62 facts: father, award number 0)"),
                                     "<answer>Brendan Nolan</answer>"], cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert FATHER in out["tool_calls"][0]["result_preview"] and out["error"] is None


def test_question_and_system_prompt_are_never_cut_old_results_are(store):
    turns = [call("node_info", entity=e) for e in ("Christopher Nolan", "Emma Thomas", "Syncopy", "Inception")]
    turns.append("<answer>Brendan Nolan</answer>")
    model = FakeChatModel(responses=turns, cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store, context_chars=7000, result_chars=1500,
                                                              max_new_tokens=100))
    for prompt in model.calls:
        assert prompt[0].text.startswith("You answer multi-hop questions") and prompt[1].text == f"Question: {Q}"
        assert sum(len(m.text) for m in prompt) <= 7000
    assert any("[an earlier result, cut to fit the context" in m.text for m in model.calls[-1])
    assert out["answer"] or out["error"]


def test_no_room_for_another_round_goes_to_the_forced_answer(store):
    model = FakeChatModel(responses=[call("node_info", entity="Christopher Nolan"), "<answer>Brendan Nolan</answer>"],
                          cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store, context_chars=4200, result_chars=1500))
    assert out["rounds"] == 1 and P.FORCE_ANSWER in model.calls[1][-1].text
    assert out["answer"] == "Brendan Nolan" and out["error"] is None


# -- native tool calling -------------------------------------------------------------------------------
def tool_call_message(name: str, i: int, **args) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"provider-{name}-{i}", "type": "tool_call"}])


def test_native_tool_calling_with_a_scripted_model(store):
    model = FakeToolCallingModel(messages=[
        tool_call_message("entity_matcher", 1, query="Inception", graph_type="films"),
        tool_call_message("node_info", 2, entity="Christopher Nolan", graph_type="films"),
        tool_call_message("node_info", 3, entity="Christopher Nolan", graph_type="films"),  # a repeat
        AIMessage("<answer>Brendan Nolan</answer>")])
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert out["answer"] == "Brendan Nolan" and out["error"] is None and out["repeated_calls"] == 1
    assert [t["function"]["name"] for t in model.tools] == [s["name"] for s in P.TOOL_SPECS]
    second = model.calls[2]
    assert isinstance(second[-1], ToolMessage) and FATHER in second[-1].text
    assert second[-1].tool_call_id == "provider-node_info-2" and "<tools>" not in second[0].text


def test_tool_mode_text_overrides_native_support(store):
    model = FakeToolCallingModel(messages=[call("node_info", entity="Inception"), "<answer>Christopher Nolan</answer>"])
    out = graph.invoke({"question": DIRECTED}, context=ctx(model, store, tool_mode="text"))
    assert out["answer"] == "Christopher Nolan" and model.tools == [] and "<tools>" in model.calls[0][0].text


def test_an_answer_one_hop_short_is_sent_back_once(store):
    """The director, for a question about the director's father: told what is left, the model goes on."""
    model = FakeChatModel(responses=[call("node_info", entity="Inception"), "<answer>Christopher Nolan</answer>",
                                     call("node_info", entity="Christopher Nolan"), "<answer>Brendan Nolan</answer>"],
                          cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert out["answer"] == "Brendan Nolan" and out["error"] is None and out["rounds"] == 4
    sent = model.calls[2][-1].text
    assert P.is_send_back(sent)
    assert sent.startswith("'Christopher Nolan' is not the final answer: the question asks for its father.")
    assert f"{FATHER}" in sent  # the facts it skipped


def test_an_answer_in_no_fact_is_sent_back_with_the_facts_where_the_question_starts(store):
    """A name only entity_matcher listed is not grounded; the run shows the start entity's facts."""
    model = FakeChatModel(responses=[call("entity_matcher", query="Inception"), "<answer>Emma Thomas</answer>",
                                     "<answer>Brendan Nolan</answer>"], cycle=False)
    out = graph.invoke({"question": DIRECTED, "topic_entities": ["Inception"]}, context=ctx(model, store))
    sent = model.calls[2][-1].text
    assert sent.startswith("Your answer 'Emma Thomas' is not in any fact you were sent. The facts of 'Inception'")
    assert "(Inception) -[directed by]-> (Christopher Nolan)" in sent and P.is_send_back(sent)
    assert out["answer"] == "Brendan Nolan"  # the second answer stands


def test_the_second_answer_stands_after_the_one_send_back(store):
    model = FakeChatModel(responses=[call("node_info", entity="Inception"), "<answer>Christopher Nolan</answer>",
                                     "<answer>Christopher Nolan</answer>"], cycle=False)
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert out["answer"] == "Christopher Nolan" and out["rounds"] == 3


@pytest.mark.parametrize("question, script", [
    # the answer is named in the question (a comparison)
    ("Whose father is Brendan Nolan, Christopher Nolan or Emma Thomas?",
     [call("node_info", entity="Christopher Nolan")]),
    # the run looked into the answer already
    (Q, [call("node_info", entity="Inception"), call("node_info", entity="Christopher Nolan")]),
    # the answer's relations are not what the question asks about
    ("Who directed Inception?", [call("node_info", entity="Inception")]),
])
def test_final_answers_are_not_sent_back(store, question, script):
    model = FakeChatModel(responses=[*script, "<answer>Christopher Nolan</answer>"], cycle=False)
    out = graph.invoke({"question": question}, context=ctx(model, store))
    assert out["answer"] == "Christopher Nolan" and out["rounds"] == len(script) + 1


def test_native_answers_get_the_same_checks(store):
    model = FakeToolCallingModel(messages=[tool_call_message("node_info", 1, entity="Inception", graph_type="films"),
                                           AIMessage("<answer>Christopher Nolan</answer>"),
                                           tool_call_message("node_info", 2, entity="Christopher Nolan"),
                                           AIMessage("<answer>Brendan Nolan</answer>")])
    out = graph.invoke({"question": Q}, context=ctx(model, store))
    assert out["answer"] == "Brendan Nolan" and out["rounds"] == 4
    assert model.calls[2][-1].text.startswith("'Christopher Nolan' is not the final answer")


def test_open_relations_leave_out_what_the_walk_covered():
    """Relations the question asks about, minus those of the path walked so far; stems match verbs."""
    def node(name, *facts):
        return NodeInfo("g", name, [Fact(r, o, d) for r, o, d in facts])
    osthryth = node("Osthryth", ("father", "Oswiu", "out"))
    oswiu = node("Oswiu", ("place of burial", "Whitby Abbey", "out"), ("father", "Æthelfrith", "out"),
                 ("father", "Osthryth", "in"))
    assert open_relations(oswiu, "Where was Osthryth's father buried?", [osthryth]) == ["place of burial"]
    assert open_relations(oswiu, "Who was the father of Osthryth?", [osthryth]) == []  # "father" was walked
    abbey = node("Whitby Abbey", ("place of burial", "Oswiu", "in"))
    assert open_relations(abbey, "Where was Osthryth's father buried?", [osthryth, oswiu]) == []  # incoming only
    pq = node("ernest_augustus", ("nationality", "united_kingdom", "out"))
    assert open_relations(pq, "what is the nation of frederica 's couple ?", []) == ["nationality"]


class OpenAIStub(BaseHTTPRequestHandler):
    """A minimal OpenAI-compatible /chat/completions that calls node_info once, then answers."""

    requests: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        OpenAIStub.requests.append(body)
        if body["messages"][-1]["role"] == "tool":
            message = {"role": "assistant", "content": "<answer>Brendan Nolan</answer>"}
        else:
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_abc", "type": "function",
                "function": {"name": "node_info", "arguments": json.dumps({"entity": "Christopher Nolan",
                                                                           "graph_type": "films"})}}]}
        data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "stub",
                           "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_native_tool_calling_over_an_openai_compatible_server(store):
    pytest.importorskip("langchain_openai")
    server = ThreadingHTTPServer(("127.0.0.1", 0), OpenAIStub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"openai:http://127.0.0.1:{server.server_address[1]}/v1#stub"
        out = graph.invoke({"question": Q}, context=ctx(url, store))
    finally:
        server.shutdown()
    assert out["answer"] == "Brendan Nolan" and out["error"] is None
    first, second = OpenAIStub.requests[-2:]
    assert [t["function"]["name"] for t in first["tools"]] == ["entity_matcher", "node_info"]
    assert second["messages"][-1]["role"] == "tool" and FATHER in second["messages"][-1]["content"]
    assert isinstance(out["messages"][0], HumanMessage)


@pytest.mark.parametrize("reply, canonical", [
    ('<think>Find X.</think>\n{"name": "node_info", "arguments": {"entity": "X", "graph_type": "g"}}\n',
     '<think>Find X.</think>\n<tool_call>\n{"name": "node_info", "arguments": {"entity": "X", "graph_type": "g"}}'
     '\n</tool_call>'),
    ('[{"name": "entity_matcher", "parameters": {"query": "Y"}}, {"node_info": {"entity": "Z"}}]',
     '<tool_call>\n{"name": "entity_matcher", "arguments": {"query": "Y"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "node_info", "arguments": {"entity": "Z"}}\n</tool_call>'),
    ("  <think>Known.</think> The answer: <answer>Paris</answer>", "<think>Known.</think>\n<answer>Paris</answer>"),
    ("<answer>1567</answer>", "<answer>1567</answer>"),
    ('<tool_call>{"name": "node_info", "arguments": }</tool_call>',  # malformed: left for the filter to drop
     '<tool_call>{"name": "node_info", "arguments": }</tool_call>'),
    ("I am not sure.", "I am not sure."),
])
def test_canonical_reply_writes_what_the_graph_read_in_the_prompted_form(reply, canonical):
    assert canonical_reply(reply) == canonical
    if canonical != reply:
        assert parse_reply(canonical).calls == [] or \
            [(c["name"], c["args"]) for c in parse_reply(canonical).calls] == \
            [(c["name"], c["args"]) for c in parse_reply(reply).calls]
