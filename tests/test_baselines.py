"""The direct (closed-book) and rag (retrieve-once) baselines."""

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from mhqa_graph.graphs import baselines_prompts as P
from mhqa_graph.graphs.baselines import BaselineContext, build_rag, direct_graph, rag_graph

from mhqa_graph.errors import InvalidQuestion
from mhqa_graph.store import open_store
from mhqa_graph.store.base import KnowledgeStore
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.types import Passage

Q = "Who is the father of the director of Inception?"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('baselines')}/s?embedder=hash")
    s.add_triples("films", [("Inception", "directed by", "Christopher Nolan"),
                            ("Christopher Nolan", "father", "Brendan Nolan"),
                            ("Titanic", "directed by", "James Cameron")])
    s.add_passages("wiki", [Passage("p1", "Inception", "Inception is a 2010 film directed by Christopher Nolan."),
                            Passage("p2", "Christopher Nolan", "Christopher Nolan is the son of Brendan Nolan."),
                            Passage("p3", "Titanic", "Titanic is a 1997 film by James Cameron.")])
    yield s
    s.close()


class UntouchableStore(KnowledgeStore):
    """A store that fails the test if anything reads it."""

    uri, backend = "untouchable://", "untouchable"

    def close(self): pass

    def _fail(self, *args, **kwargs):
        raise AssertionError("the store was used")

    _add_triples = _add_passages = _match_entities = _node_info = _search = _passages = _stats = \
        _collection_names = _fail


def user_prompt(model: FakeChatModel) -> str:
    return model.calls[0][-1].text


# -- direct --------------------------------------------------------------------------------
def test_direct_answers_without_retrieval():
    model = FakeChatModel(responses=["<think>Nolan's father...</think><answer>Brendan Nolan</answer>"])
    out = direct_graph.invoke({"question": Q}, context=BaselineContext(llm=model, store=UntouchableStore(),
                                                                       corpus="wiki", graph="films"))
    assert out["answer"] == "Brendan Nolan" and out["error"] is None
    assert out["raw"].startswith("<think>")
    assert user_prompt(model) == f"Question: {Q}" and len(model.calls) == 1


@pytest.mark.parametrize("think", [True, False])
def test_direct_think_setting(think):
    model = FakeChatModel(responses=["Answer: Brendan Nolan\nbecause ..."])
    out = direct_graph.invoke({"question": Q}, context=BaselineContext(llm=model, think=think))
    assert out["answer"] == "Brendan Nolan"  # untagged replies are cleaned up
    assert (P.THINK_ON in model.calls[0][0].text) is think


def test_direct_model_error_and_empty_reply():
    out = direct_graph.invoke({"question": Q}, context=BaselineContext(llm=FakeChatModel(responses=[], cycle=False)))
    assert out["answer"] == "" and out["error"].startswith("ModelError:")
    model = FakeChatModel(responses=["<answer></answer>"])
    out = direct_graph.invoke({"question": Q}, context=BaselineContext(llm=model))
    assert out["answer"] == "" and out["error"].startswith("MalformedOutput")


@pytest.mark.parametrize("app", [direct_graph, rag_graph])
def test_invalid_question(app):
    model = FakeChatModel(responses=["<answer>x</answer>"])
    with pytest.raises(InvalidQuestion):
        app.invoke({"question": "  "}, context=BaselineContext(llm=model, store=UntouchableStore(), corpus="wiki"))
    assert model.calls == []


# -- rag -----------------------------------------------------------------------------------
def test_rag_puts_the_passages_in_the_prompt(store):
    model = FakeChatModel(responses=["<answer>Brendan Nolan</answer>"])
    out = rag_graph.invoke({"question": Q}, context=BaselineContext(llm=model, store=store, corpus="wiki", top_k=2,
                                                                    graph="films"))
    assert out["answer"] == "Brendan Nolan" and out["error"] is None and out["source"] == "corpus:wiki"
    assert len(out["retrieved"]) == 2 and out["retrieved"][0]["id"] == "p1" and out["retrieved"][0]["score"] > 0
    prompt = user_prompt(model)
    assert prompt.startswith("Retrieved passages:\n[1] Inception: Inception is a 2010 film directed by")
    assert prompt.endswith(f"Question: {Q}") and "Facts from the knowledge graph" not in prompt


def test_rag_falls_back_to_kg_facts(store):
    model = FakeChatModel(responses=["<answer>Christopher Nolan</answer>"])
    out = rag_graph.invoke({"question": "Who directed Inception?"},
                           context=BaselineContext(llm=model, store=store, graph="films", kg_nodes=1))
    assert out["source"] == "graph:films" and [r["entity"] for r in out["retrieved"]] == ["Inception"]
    prompt = user_prompt(model)
    assert prompt.startswith("Facts from the knowledge graph:\nEntity: Inception\n")
    assert "(Inception) -[directed by]-> (Christopher Nolan)" in prompt and "Brendan" not in prompt


def test_rag_kg_uses_topic_entities(store):
    model = FakeChatModel(responses=["<answer>Brendan Nolan</answer>"])
    out = rag_graph.invoke({"question": Q, "topic_entities": ["Christopher Nolan"]},
                           context=BaselineContext(llm=model, store=store, graph="films", kg_nodes=1))
    assert out["retrieved"][0]["entity"] == "Christopher Nolan"
    assert "(Christopher Nolan) -[father]-> (Brendan Nolan)" in user_prompt(model)


@pytest.mark.parametrize("settings, error", [({}, "NoSource:"), ({"corpus": "nope"}, "UnknownCorpus:"),
                                             ({"graph": "nope"}, "UnknownGraph:")])
def test_rag_without_a_usable_source_ends_without_asking(store, settings, error):
    model = FakeChatModel(responses=["<answer>x</answer>"])
    out = rag_graph.invoke({"question": Q}, context=BaselineContext(llm=model, store=store, **settings))
    assert out["error"].startswith(error) and out["answer"] == "" and model.calls == []


def test_rag_stream_updates_and_dict_context(store):
    model = FakeChatModel(responses=["<answer>Brendan Nolan</answer>"])
    updates = list(rag_graph.stream({"question": Q}, context={"llm": model, "store": store, "corpus": "wiki"},
                                    stream_mode="updates"))
    assert [next(iter(u)) for u in updates] == ["start", "retrieve", "answer"]
    assert updates[1]["retrieve"]["retrieved"][0]["id"] == "p1"
    assert updates[2]["answer"]["answer"] == "Brendan Nolan"


class Interrupted(BaseException):
    """Like KeyboardInterrupt: not a model failure, so it is not turned into a ModelError."""


def test_rag_sqlite_checkpoint_and_resume(store, tmp_path, monkeypatch):
    searches = []
    real = store.search
    monkeypatch.setattr(store, "search", lambda *a, **k: searches.append(a) or real(*a, **k))
    calls = []

    def respond(messages):
        calls.append(messages)
        if len(calls) == 1:
            raise Interrupted()
        return "<answer>Brendan Nolan</answer>"

    context = BaselineContext(llm=FakeChatModel(respond=respond), store=store, corpus="wiki")
    config = {"configurable": {"thread_id": "rag-1"}}
    with SqliteSaver.from_conn_string(str(tmp_path / "ckpt.sqlite")) as saver:
        app = build_rag(checkpointer=saver)
        with pytest.raises(Interrupted):
            app.invoke({"question": Q}, config, context=context)
        assert app.get_state(config).next == ("answer",)
        out = app.invoke(None, config, context=context)
    assert out["answer"] == "Brendan Nolan" and len(calls) == 2 and len(searches) == 1


@pytest.mark.parametrize("app, inputs, extra", [(direct_graph, set(), {"raw", "confidence", "answer_logprobs"}), (
    rag_graph, {"query"}, {"raw", "source", "retrieved", "confidence", "answer_logprobs"})])
def test_schemas_for_studio(app, inputs, extra):
    assert set(app.get_input_jsonschema()["properties"]) == {"question", "topic_entities"} | inputs
    assert set(app.get_output_jsonschema()["properties"]) == {"answer", "error"} | extra
    assert {"corpus", "graph", "top_k", "kg_nodes", "confidence"} <= set(app.get_context_jsonschema()["properties"])
