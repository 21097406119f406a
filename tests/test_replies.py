"""Constrained replies: each role's format reaches the backend as a grammar, and a real llama.cpp model
decoding under it writes replies that the role's own parser reads."""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.calls import get_llm
from mhqa_graph.graphs.mujica import prompts as M
from mhqa_graph.graphs.mujica.graph import read_worker, worker_reply
from mhqa_graph.graphs.mujica.plan import read_plan, read_turn
from mhqa_graph.graphs.omne import prompts as W
from mhqa_graph.graphs.omne.protocol import parse_reply
from mhqa_graph.graphs.opera import prompts as O
from mhqa_graph.graphs.opera.analysis import check_analysis, parse_final, parse_rewrite, read_analysis
from mhqa_graph.graphs.opera.plan import check_plan, plan_subgoals
from mhqa_graph.graphs.settings import check_question

from mhqa_graph.errors import InvalidInput
from mhqa_graph.models.packs import pack_installed
from mhqa_graph.parsing import extract_json, final_answer
from mhqa_graph.replies import ReplyFormat, answer_reply, can_constrain, decoding_kwargs
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.testing.replay import RecordingChatModel
from mhqa_graph.traces import TraceRecorder

HAS_SMOLLM = importlib.util.find_spec("llama_cpp") is not None and pack_installed("smollm2-135m")

# role -> (format, parse: reply text -> value, raising or None when unusable)
FORMATS = {
    "opera plan": (O.plan_format(4), lambda t: check_plan(extract_json(t))),
    "opera analysis": (O.analysis_format(False), lambda t: check_analysis(extract_json(t, dict))),
    "opera rewrite": (O.REWRITE_FORMAT, lambda t: parse_rewrite(t) or None),
    "opera answer": (O.ANSWER_FORMAT, lambda t: parse_final(t) or None),
    "mujica planner": (M.planner_format(False, True, False, 6),
                       lambda t: read_plan(extract_json(t), final=False, pending=False)),
    "mujica worker": (M.worker_format(3, False), lambda t: read_worker(extract_json(t, dict), 3)),
    "omne tool-agent": (W.tool_format(["kg"], False, 1), lambda t: (r := parse_reply(t)).calls or r.answer),
    "rag answer": (answer_reply("answer"), lambda t: final_answer(t) if "<answer>" in t else None),
}


def test_formats_map_to_backends():
    fmt = O.REWRITE_FORMAT
    grammar_model = FakeChatModel(accepts_grammar=True)
    assert decoding_kwargs(grammar_model, fmt) == ({"grammar": fmt.gbnf()}, "grammar")
    assert decoding_kwargs(RecordingChatModel(inner=grammar_model), fmt)[1] == "grammar"
    assert decoding_kwargs(FakeChatModel(), fmt) == ({}, "prompt")
    assert fmt.response_format() == {"type": "json_schema", "json_schema": {
        "name": "rewrite", "schema": fmt.schema, "strict": True}}
    assert answer_reply("answer", think=True).response_format() is None  # no JSON schema for a think block
    assert M.worker_format(2, True).response_format() is None
    transformers = importlib.util.find_spec("xgrammar") is not None  # hf: and packs, through xgrammar
    assert [can_constrain(s) for s in ("llamacpp:qwen2.5-coder-1.5b", "openai:http://x/v1#m", "qwen2.5-coder-1.5b",
                                       "hf:/some/folder", "fake:[\"x\"]", "nope")] == \
        [True, True, transformers, transformers, False, False]


def test_schemas_carry_the_constraints():
    worker = M.worker_format(3, True).schema["properties"]
    assert worker["relevant"]["items"]["enum"] == [1, 2, 3] and worker["relevant"]["maxItems"] == 3
    planner = M.planner_format(False, True, True, 4).schema["anyOf"][0]["properties"]["subquestions"]
    assert planner["items"]["properties"]["id"]["enum"] == ["q1", "q2", "q3", "q4"] and planner["maxItems"] == 4
    assert M.planner_format(True, True, True, 4).schema["required"] == ["answer"]  # a final turn only answers
    assert "anyOf" not in M.planner_format(False, False, True, 4).schema  # before the workers: only ask
    assert O.plan_format(7).schema["properties"]["subgoals"]["maxItems"] == 7
    calls = W.tool_format(["a", "b"], True, 2).schema["anyOf"]
    assert [c["properties"]["arguments"]["properties"]["graph_type"]["enum"] for c in calls] == [["a", "b"]] * 2
    gbnf = W.tool_format(["a"], True, 2).gbnf()
    assert gbnf.startswith("root ::= reply-think reply-body") and '"<think>" [^<]{0,1200} "</think>"' in gbnf


@pytest.mark.parametrize("decoding, grammar", [("auto", True), ("prompt", False)])
def test_rag_passes_its_format_unless_decoding_is_prompt(mhqa_store, decoding, grammar):
    model = FakeChatModel(accepts_grammar=True, responses=["<think>The passage says so.</think><answer>Tulsa</answer>"])
    context = make_context("rag", llm=model, store=mhqa_store, corpus="docs", decoding=decoding)
    recorder = TraceRecorder("rag", context)
    out = build_graph("rag").invoke({"question": "Where was it?"}, context=context, config={"callbacks": [recorder]})
    assert out["answer"] == "Tulsa"
    assert (model.grammars[0] == answer_reply("answer", think=True).gbnf()) is grammar
    assert recorder.trace(out).llm_calls[0].decoding == ("grammar" if grammar else "prompt")


def test_a_think_block_gets_tokens_of_its_own_beside_the_reply_budget():
    """A grammar lets a think block of THINK_CHARS come first; the reply's token budget is for what follows it,
    so a model that thinks to the bound still has max_new_tokens to write its answer in."""
    budgets = []

    class Recording(FakeChatModel):
        max_new_tokens: int | None = None  # None: the context's budget

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            budgets.append(kwargs.get("max_new_tokens"))
            return super()._generate(messages, stop, run_manager, **kwargs)

    context = make_context("rag", llm=Recording(accepts_grammar=True, responses=["<answer>x</answer>"]),
                           max_new_tokens=100, corpus="docs")
    for think in (True, False):
        get_llm(context, "answer", reply=answer_reply("answer", think=think)).invoke("q")
    assert answer_reply("answer", think=True).think_tokens() == 400
    assert budgets == [100 + 400, None]  # without a think block the model's own budget (ctx.max_new_tokens)
    own = Recording(accepts_grammar=True, responses=["<answer>x</answer>"], max_new_tokens=1000)
    get_llm(make_context("rag", llm=own, max_new_tokens=100, corpus="docs"), "answer",
            reply=answer_reply("answer", think=True)).invoke("q")
    assert budgets[-1] == 1000 + 400  # a model object with a budget of its own keeps it


def test_rag_repairs_a_reply_without_an_answer_once(mhqa_store):
    model = FakeChatModel(responses=["<think>It must be Tulsa, in Oklahoma", "<answer>Tulsa</answer>"])
    out = build_graph("rag").invoke({"question": "Where?"},
                                    context=make_context("rag", llm=model, store=mhqa_store, corpus="docs"))
    assert out["answer"] == "Tulsa" and out["error"] is None and len(model.calls) == 2
    assert model.calls[1][-1].text.startswith("That reply could not be used (it has no <answer> tag)")
    none_left = FakeChatModel(responses=["<think>Oklahoma, so its largest city <answer></answer>"])
    out = build_graph("direct").invoke({"question": "Where?"}, context=make_context("direct", llm=none_left,
                                                                                   parse_retries=0))
    assert out["error"] == "MalformedOutput: the reply has no answer" and len(none_left.calls) == 1


def test_decoding_settings_are_checked():
    with pytest.raises(InvalidInput, match="decoding must be one of auto, constrained, prompt"):
        make_context("rag", llm="fake", decoding="grammar")
    with pytest.raises(InvalidInput, match="decoding=constrained: llm .* cannot be constrained"):
        make_context("rag", llm="fake:[\"x\"]", decoding="constrained")
    make_context("rag", llm=FakeChatModel(accepts_grammar=True), decoding="constrained", corpus="docs")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM, reason="needs llama-cpp-python and the smollm2-135m pack")
@pytest.mark.parametrize("role", list(FORMATS))
def test_a_tiny_model_under_the_grammar_writes_what_the_parser_reads(role):
    """SmolLM2-135M cannot follow the agents' formats from the prompt; under each role's grammar every reply
    parses (the grammar makes replies well-formed, not right)."""
    from mhqa_graph.models.factory import load_chat_model

    fmt, parse = FORMATS[role]
    model = load_chat_model("llamacpp:smollm2-135m?threads=1", max_new_tokens=160)
    kwargs, how = decoding_kwargs(model, fmt)
    prompt = [SystemMessage(f"Reply in the {fmt.name} format."),
              HumanMessage(check_question("Who directed Inception, and where was he born?"))]
    reply = model.invoke(prompt, **kwargs)
    assert how == "grammar" and reply.response_metadata["decoding"] == "grammar"
    assert parse(reply.text), f"{role}: {json.dumps(reply.text)}"


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM, reason="needs llama-cpp-python and the smollm2-135m pack")
def test_a_grammar_llama_cpp_rejects_falls_back_to_the_prompt():
    """A grammar llama.cpp cannot parse would crash its sampler: it is checked first, and the call runs
    unconstrained, saying so in its metadata."""
    from mhqa_graph.models.factory import load_chat_model

    model = load_chat_model("llamacpp:smollm2-135m?threads=1", max_new_tokens=4)
    reply = model.invoke([HumanMessage("Say hi.")], grammar="root ::= (")
    assert reply.response_metadata["decoding"] == "prompt"
    assert reply.response_metadata["decoding_error"] == "llama.cpp rejected the grammar"


class SchemaStub(BaseHTTPRequestHandler):
    """An OpenAI-compatible /chat/completions that refuses response_format (HTTP 400) when `refuse` is set."""

    refuse = False
    requests: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        SchemaStub.requests.append(body)
        if self.refuse and "response_format" in body:
            reply, code = {"error": {"message": "response_format is not supported",
                                     "type": "invalid_request_error"}}, 400
        else:
            reply, code = {"id": "x", "object": "chat.completion", "created": 0, "model": "stub", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": '{"query": "Inception director"}'},
                 "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}, 200
        data = json.dumps(reply).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.mark.skipif(importlib.util.find_spec("langchain_openai") is None, reason="needs the openai extra")
@pytest.mark.parametrize("refuse", [False, True])
def test_openai_servers_get_the_json_schema_and_a_refusal_falls_back(refuse):
    from mhqa_graph.graphs.calls import ask_message, get_llm
    from mhqa_graph.graphs.opera.analysis import read_rewrite
    from mhqa_graph.graphs.settings import AgentContext

    SchemaStub.refuse, SchemaStub.requests = refuse, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), SchemaStub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ctx = AgentContext(llm=f"openai:http://127.0.0.1:{server.server_address[1]}/v1#stub", model_retries=0)
        recorder = TraceRecorder("opera")
        reply = ask_message(get_llm(ctx, "rewrite", reply=O.REWRITE_FORMAT).with_config(callbacks=[recorder]),
                            [HumanMessage("Rewrite: who directed Inception?")])
    finally:
        server.shutdown()
    assert read_rewrite(reply) == "Inception director"
    # a reply to the schema is read as its model, one the fallback gave tolerantly
    assert reply.response_metadata.get("decoding") == (None if refuse else "json_schema")
    assert SchemaStub.requests[0]["response_format"] == O.REWRITE_FORMAT.response_format()
    calls = recorder.trace().llm_calls
    if refuse:  # asked again without the schema; the trace says so
        assert "response_format" not in SchemaStub.requests[1] and len(SchemaStub.requests) == 2
        assert calls[-1].decoding == "prompt" and calls[-1].decoding_error == "the server refused the json_schema"
    else:
        assert len(SchemaStub.requests) == 1 and calls[-1].decoding == "json_schema"


def every_format() -> list:
    """Each format the agents send: think blocks, several calls, a root anyOf."""
    return [O.plan_format(7), O.analysis_format(True), O.analysis_format(False), O.REWRITE_FORMAT,
            O.ANSWER_FORMAT, M.SHORT_FORMAT, answer_reply("answer", True), answer_reply("answer", False),
            *(M.planner_format(final, may, think, 12) for final in (True, False) for may in (True, False)
              for think in (True, False)),
            *(M.worker_format(n, think) for n in (0, 5) for think in (True, False)),
            *(W.tool_format(graphs, think, calls) for graphs in ([], ["a", "b"]) for think in (True, False)
              for calls in (1, 5))]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM, reason="needs llama-cpp-python and the smollm2-135m pack")
def test_every_role_format_compiles_in_llama_cpp():
    """llama.cpp's own parser accepts each format the agents send (a grammar it rejected would silently fall
    back to the prompt)."""
    from mhqa_graph.models.factory import load_chat_model

    model = load_chat_model("llamacpp:smollm2-135m?threads=1")
    model._load()
    for fmt in every_format():
        model._grammar(fmt.gbnf())  # raises ValueError if llama.cpp rejects it


# -- transformers models, through xgrammar -----------------------------------------------------
needs_xgrammar = pytest.mark.skipif(importlib.util.find_spec("xgrammar") is None or
                                    importlib.util.find_spec("transformers") is None,
                                    reason="needs the models extra (transformers, xgrammar)")


def tiny_chat(**kwargs):
    from mhqa_graph.training.tiny import tiny_model_and_tokenizer

    from mhqa_graph.models.chat import TransformersChatModel

    model, tokenizer = tiny_model_and_tokenizer()
    return TransformersChatModel.from_loaded(model, tokenizer, model_name="tiny", **kwargs)


@needs_xgrammar
def test_every_role_format_compiles_in_xgrammar():
    from mhqa_graph.training.tiny import tiny_tokenizer

    from mhqa_graph.models.grammar import GrammarCache

    cache = GrammarCache(tiny_tokenizer())
    for fmt in every_format():
        cache.processor(fmt.gbnf())  # raises ValueError if xgrammar rejects it


@pytest.fixture()
def fresh_schema_rules():
    """Schemas converted afresh in the test and forgotten after it: the conversion is cached per process, and a
    test that hides llama-cpp-python must neither read nor leave rules of the other converter."""
    from mhqa_graph import replies

    replies._schema_rules.cache_clear()
    yield
    replies._schema_rules.cache_clear()


def hide_llama_cpp(monkeypatch) -> None:
    """As on a machine with the `train` extra alone: llama-cpp-python is not installed."""
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name.split(".")[0] == "llama_cpp" else found(name, *args))


@needs_xgrammar
@pytest.mark.parametrize("converter", ["llama_cpp", "xgrammar"])
def test_values_with_a_quote_or_a_backslash_keep_the_grammar_whole(converter, monkeypatch, fresh_schema_rules):
    """A fact written `"Never Be the Same` (2Wiki's title, with its stray quote) or "Zürich" is an answer the grammar
    allows, and only as JSON writes it: llama-cpp-python's own converter left the backslash of `\\"` unescaped,
    llama.cpp rejected the whole grammar and the call went unconstrained."""
    from xgrammar.testing import _is_grammar_accept_string as accepts

    if converter == "llama_cpp":
        pytest.importorskip("llama_cpp")
    else:
        hide_llama_cpp(monkeypatch)
    grammar = O.analysis_format(False, {"type": "string", "enum": ['"Never Be the Same', "back\\slash", "Zürich",
                                                                 ""]}).gbnf()
    for answer, allowed in (('"Never Be the Same', True), ("back\\slash", True), ("Never Be the Same", False)):
        assert accepts(grammar, json.dumps({"answer": answer, "sufficient": True})) == allowed, answer
    written = json.dumps({"answer": "Zürich", "sufficient": True}, ensure_ascii=False)  # as the model writes it
    assert accepts(grammar, written) and not accepts(grammar, written.replace("ü", "\\u00fc"))


@needs_xgrammar
def test_without_llama_cpp_the_schemas_convert_through_xgrammar(monkeypatch, fresh_schema_rules):
    """The `train` extra alone (a GPU machine with no llama-cpp-python): a reply's JSON schema turns into grammar
    rules through xgrammar, every format compiles for the policy, and a tiny model under each role's grammar writes
    what the parser reads."""
    from mhqa_graph.training.tiny import tiny_tokenizer

    from mhqa_graph.models.grammar import GrammarCache

    hide_llama_cpp(monkeypatch)
    cache = GrammarCache(tiny_tokenizer())
    for fmt in every_format():
        text = fmt.gbnf()
        assert fmt.turn in ("answer", "line") or "json-root ::= ((" in text  # xgrammar's rules, not llama.cpp's
        cache.processor(text)
    model = tiny_chat(max_new_tokens=1500)
    for role in ("opera analysis", "mujica worker", "omne tool-agent"):
        fmt, parse = FORMATS[role]
        reply = model.invoke([HumanMessage(check_question("Who directed Inception?"))], grammar=fmt.gbnf())
        assert reply.response_metadata["decoding"] == "grammar" and parse(reply.text), (role, reply.text)


@needs_xgrammar
@pytest.mark.parametrize("role", list(FORMATS))
def test_a_transformers_model_under_the_grammar_writes_what_the_parser_reads(role):
    """A random tiny model writes nothing the agents can read; under each role's grammar (decoding "grammar"
    on every call, as for llama.cpp) every reply parses."""
    fmt, parse = FORMATS[role]
    model = tiny_chat(max_new_tokens=1500)
    kwargs, how = decoding_kwargs(model, fmt)
    prompt = [SystemMessage(f"Reply in the {fmt.name} format."),
              HumanMessage(check_question("Who directed Inception, and where was he born?"))]
    reply = model.invoke(prompt, **kwargs)
    assert how == "grammar" and reply.response_metadata["decoding"] == "grammar"
    assert reply.response_metadata["finish_reason"] == "stop" and parse(reply.text), json.dumps(reply.text)
    assert not readable(parse, model.invoke(prompt, max_new_tokens=96).text)  # free, it writes nothing readable


def readable(parse, text: str) -> bool:
    try:
        return bool(parse(text))
    except ValueError:
        return False


@needs_xgrammar
def test_the_grammar_masks_before_the_samplers_top_k():
    """The grammar's mask must come before transformers' top-k: with top_k=1 keeping a token the grammar
    forbids, nothing would be left to sample."""
    fmt = ReplyFormat("short", turn="answer", answer_chars=12)
    model = tiny_chat(max_new_tokens=40, temperature=1.0)
    free = model.invoke("Who?", temperature=0.0).text
    assert not free.startswith("<answer>")  # the model's own first choice is one the grammar forbids
    model._model.generation_config.top_k = 1
    replies = {model.invoke("Who?", grammar=fmt.gbnf()).text for _ in range(3)}
    assert all(re.fullmatch(r"<answer>[^<\n]{1,12}</answer>", r) for r in replies), replies
    assert len(replies) == 1  # top_k=1 still applies, among the allowed tokens


@needs_xgrammar
def test_a_grammar_xgrammar_rejects_falls_back_to_the_prompt():
    reply = tiny_chat(max_new_tokens=4).invoke("Say hi.", grammar="root ::= (")
    assert reply.response_metadata["decoding"] == "prompt"
    assert reply.response_metadata["decoding_error"].startswith("xgrammar rejected the grammar")


@needs_xgrammar
def test_a_tokenizer_xgrammar_cannot_read_falls_back_to_the_prompt(monkeypatch):
    from mhqa_graph.models import grammar

    def unreadable(*args, **kwargs):
        raise RuntimeError("unknown vocabulary type")

    monkeypatch.setattr(grammar, "GrammarCache", unreadable)
    reply = tiny_chat(max_new_tokens=4).invoke("Say hi.", grammar=answer_reply("a").gbnf())
    assert reply.response_metadata["decoding"] == "prompt"
    assert reply.response_metadata["decoding_error"] == \
        "xgrammar cannot read the tokenizer: RuntimeError: unknown vocabulary type"


@needs_xgrammar
def test_chat_models_over_one_tokenizer_compile_a_grammar_once(monkeypatch):
    """A trainer makes a chat model per episode over the same tokenizer: the grammar is compiled once."""
    from mhqa_graph.models.chat import TransformersChatModel
    from mhqa_graph.models.grammar import cache_for

    first = tiny_chat(max_new_tokens=8)
    tokenizer = first._tokenizer
    compiles = []
    cache = cache_for(tokenizer, first._model.config.vocab_size)
    compile_grammar = cache._compiler.compile_grammar
    monkeypatch.setattr(cache._compiler, "compile_grammar", lambda g: compiles.append(g) or compile_grammar(g))
    gbnf = ReplyFormat("short", turn="answer", answer_chars=5).gbnf()
    for model in (first, TransformersChatModel.from_loaded(first._model, tokenizer, max_new_tokens=8)):
        assert model.invoke("Who?", grammar=gbnf).response_metadata["decoding"] == "grammar"
    assert compiles == [gbnf]


# -- LangChain chat models with structured output --------------------------------------------------
class StructuredFake(FakeChatModel):
    """A chat model that implements `with_structured_output` itself, as Anthropic's or Gemini's does: it returns
    {"raw", "parsed", "parsing_error"} from the scripted reply, parsed as the pydantic model it was given; `schemas`
    keeps what it was asked for."""

    schemas: list = []

    def with_structured_output(self, schema, *, include_raw=False, **kwargs):
        from langchain_core.runnables import RunnableLambda

        self.schemas.append(schema)

        def run(messages):
            raw = self.invoke(messages)
            try:
                parsed, error = schema.model_validate_json(raw.text), None
            except ValueError as exc:
                parsed, error = None, exc
            return {"raw": raw, "parsed": parsed, "parsing_error": error} if include_raw else parsed

        return RunnableLambda(run)


def test_a_model_with_structured_output_is_called_with_it_and_traced_so(tmp_path):
    from mhqa_graph.graphs import build_graph, make_context

    from mhqa_graph.store import open_store
    from mhqa_graph.traces import TraceRecorder
    from mhqa_graph.types import Passage

    store = open_store(f"embedded://{tmp_path}/s?embedder=hash")
    store.add_passages("wiki", [Passage("p1", "Inception", "Inception is a film directed by Christopher Nolan.")])
    plan = StructuredFake(responses=['{"subgoals": ["Who directed Inception?"]}'], schemas=[])
    analysis = StructuredFake(responses=['{"reasoning": "p1", "sufficient": true, "answer": "Christopher Nolan"}'],
                              schemas=[])
    roles = {"plan": plan, "analysis": analysis, "rewrite": FakeChatModel(responses=['{"query": "x"}']),
             "answer": FakeChatModel(responses=["Christopher Nolan"])}  # a plain BaseChatModel: the prompt
    ctx = make_context("opera", llm=FakeChatModel(responses=["unused"]), role_llms=roles, store=store, corpus="wiki")
    recorder = TraceRecorder("opera", ctx)
    out = build_graph("opera").invoke({"question": "Who directed Inception?"}, {"callbacks": [recorder]}, context=ctx)
    assert out["answer"] == "Christopher Nolan"
    schema = plan.schemas[0].model_json_schema()
    assert schema["title"] == "plan" and schema["properties"]["subgoals"]["type"] == "array"
    assert "sufficient" in analysis.schemas[0].model_fields
    decoded = {c.role: c.decoding for c in recorder.trace(out).llm_calls}
    assert decoded == {"plan": "structured_output", "analysis": "structured_output", "answer": "prompt"}
    store.close()


class CannotStructure(FakeChatModel):
    """Declares `with_structured_output` but cannot give it: NotImplementedError when asked."""

    def with_structured_output(self, schema, **kwargs):
        raise NotImplementedError("no tool calling")


class SchemaRefused(Exception):
    status_code = 400  # as providers' clients raise a bad request


class RefusesSchema(FakeChatModel):
    """A provider that rejects the schema when called (HTTP 400)."""

    def with_structured_output(self, schema, **kwargs):
        from langchain_core.runnables import RunnableLambda

        def refuse(messages):
            raise SchemaRefused("Invalid schema for response_format")

        return RunnableLambda(refuse)


@pytest.mark.parametrize(("model", "why"), [(CannotStructure, "has no structured output for this schema"),
                                            (RefusesSchema, "the provider refused the schema: SchemaRefused")])
def test_a_model_that_cannot_give_the_schema_falls_back_to_the_prompt(model, why, tmp_path):
    """OPERA with a model whose with_structured_output raises NotImplementedError, or whose provider refuses the
    schema, answers through the prompt; the trace says why (issue 64, 4)."""
    from mhqa_graph.graphs import build_graph, make_context

    from mhqa_graph.store import open_store
    from mhqa_graph.traces import TraceRecorder
    from mhqa_graph.types import Passage

    with open_store(f"embedded://{tmp_path}/s?embedder=hash") as store:
        store.add_passages("wiki", [Passage("p1", "Inception", "Inception is a film directed by Christopher Nolan.")])
        roles = {"plan": model(responses=['{"subgoals": ["Who directed Inception?"]}']),
                 "analysis": model(responses=['{"reasoning": "p1", "sufficient": true, '
                                              '"answer": "Christopher Nolan"}']),
                 "rewrite": FakeChatModel(responses=['{"query": "x"}']),
                 "answer": FakeChatModel(responses=["Christopher Nolan"])}
        ctx = make_context("opera", llm=FakeChatModel(responses=["unused"]), role_llms=roles, store=store,
                           corpus="wiki")
        make_context("opera", llm=model(), corpus="wiki", decoding="constrained")  # such a model qualifies
        recorder = TraceRecorder("opera", ctx)
        out = build_graph("opera").invoke({"question": "Who directed Inception?"}, {"callbacks": [recorder]},
                                          context=ctx)
    assert out["answer"] == "Christopher Nolan" and out["error"] is None
    calls = [c for c in recorder.trace(out).llm_calls if c.role in ("plan", "analysis")]
    assert {(c.role, c.decoding) for c in calls} == {("plan", "prompt"), ("analysis", "prompt")}
    assert all(why in c.decoding_error for c in calls)


def test_a_reply_model_gives_the_schema_and_the_format_line_from_one_declaration():
    from mhqa_graph.graphs.opera import prompts as P
    from pydantic import Field
    from pydantic.json_schema import SkipJsonSchema

    from mhqa_graph.replies import Reply

    class Judged(Reply):
        """A judgement."""

        why: str = Field(min_length=0, max_length=10, description="a reason")
        ok: bool = Field(description="true or false")

    class Bare(Judged):
        why: SkipJsonSchema[str] = ""

    assert Judged.line() == '{"why": "a reason", "ok": true or false}'
    assert Judged.line(why="why it is so") == '{"why": "why it is so", "ok": true or false}'
    assert Bare.line() == '{"ok": true or false}'
    assert Bare.reply("x").schema == {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                                      "additionalProperties": False}  # no titles or descriptions: the prompt shows them
    asked = Judged.reply("x", think=True, why={"type": "string", "enum": ["a", "b"]})
    assert asked.think and asked.schema["properties"]["why"] == {"type": "string", "enum": ["a", "b"]}
    assert asked.shape.model_json_schema()["title"] == "x"
    assert asked.parse('<think>hm</think>\n{"why": "a", "ok": true}') == asked.shape(why="a", ok=True)
    with pytest.raises(ValueError, match="does not match its format: Field required at ok"):
        asked.parse('<think>hm</think>{"why": "a"}')
    # OPERA's analysis: the prompt's format line names exactly the fields its grammar allows
    for think, line in ((True, P.ANALYSIS_FORMAT_THINK), (False, P.ANALYSIS_FORMAT_DIRECT)):
        fields = P.analysis_format(think).schema["properties"]
        assert [f'"{name}"' in line for name in fields] == [True] * len(fields) and line.count('": ') == len(fields)


def test_a_held_reply_is_read_as_its_model_and_any_other_tolerantly():
    """A reply the backend held to its format (decoded under a grammar or a JSON schema, not cut off) is its model;
    a prompted one, a fake's, or one cut off by the token limit is None: the role's alias parser reads it."""
    from langchain_core.messages import AIMessage
    from mhqa_graph.graphs.mujica.replies import Conclusion, Plan

    from mhqa_graph.replies import held

    def said(text, **meta):
        return AIMessage(text, response_metadata=meta)

    fmt = M.planner_format(False, True, False, 4)
    concluded = held(said('{"answer": "Paris"}', decoding="grammar"), fmt)
    assert isinstance(concluded, Conclusion) and concluded.answer == "Paris"
    plan = held(said('{"subquestions": [{"id": "q1", "question": "Who?", "depends_on": []}]}',
                     decoding="json_schema"), fmt)
    assert isinstance(plan, Plan) and plan.subquestions[0].question == "Who?"
    assert held(said('{"answer": "Paris"}'), fmt) is None  # no backend said it held the reply: the fakes
    assert held(said('{"answer": "Paris"}', decoding="prompt"), fmt) is None
    assert held(said('{"subquestions": [{"id": "q1"', decoding="grammar", finish_reason="length"), fmt) is None
    with pytest.raises(ValueError):  # an alias the tolerant parser reads is no reply of the format
        held(said('{"sub_questions": []}', decoding="grammar"), fmt)
    parsed = Conclusion(answer="Rome")
    assert held(AIMessage('{"answer": "Rome"}', additional_kwargs={"parsed": parsed}), fmt) is parsed


HELD_READS = {  # role -> (format, read the model, read tolerantly, a reply the format allows)
    "opera plan": (O.plan_format(4), plan_subgoals, check_plan,
                   '{"subgoals": ["Who  directed Inception?", "Where was [Answer1] born?"]}'),
    "opera relation plan": (O.plan_format(3, ["Inception"], "relation"), plan_subgoals, check_plan,
                            '{"subgoals": [{"entity": "Inception", "relation": " director "}]}'),
    "opera analysis": (O.analysis_format(True), read_analysis, check_analysis,
                       '{"reasoning": "p1", "sufficient": true, "answer": "Answer: Nolan"}'),
    "mujica plan": (M.planner_format(False, True, False, 4), lambda r: read_turn(r, False),
                    lambda v: read_plan(v, False, False),
                    '{"subquestions": [{"id": "q1", "question": "Who directed  Inception?", "depends_on": []}, '
                    '{"id": "q2", "question": "Where was #q1 born?", "depends_on": ["q1"]}]}'),
    "mujica relation plan": (M.planner_format(False, True, False, 4, None, "relation"),
                             lambda r: read_turn(r, False), lambda v: read_plan(v, False, False),
                             '{"subquestions": [{"id": "q1", "entity": "Inception", "relation": "director"}]}'),
    "mujica conclusion": (M.planner_format(False, True, False, 4), lambda r: read_turn(r, False),
                          lambda v: read_plan(v, False, False), '{"answer": "Christopher Nolan"}'),
    "mujica worker": (M.worker_format(3, False), lambda r: worker_reply(r, 3), lambda v: read_worker(v, 3),
                      '{"relevant": [3, 1, 3], "answer": " Nolan "}'),
}


@pytest.mark.parametrize("role", list(HELD_READS))
def test_a_held_reply_is_read_as_the_tolerant_parser_reads_it(role):
    """The model of a reply the backend held to its format and the tolerant parser give the same value."""
    from langchain_core.messages import AIMessage

    from mhqa_graph.replies import held

    fmt, read, loose, text = HELD_READS[role]
    assert read(held(AIMessage(text, response_metadata={"decoding": "grammar"}), fmt)) == loose(extract_json(text))


class HeldFake(FakeChatModel):
    """A llama.cpp model in a test: each scripted reply says it was decoded under the grammar it was given."""

    accepts_grammar: bool = True

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        result = super()._generate(messages, stop, run_manager, **kwargs)
        result.generations[0].message.response_metadata["decoding"] = "grammar" if kwargs.get("grammar") else "prompt"
        return result


@pytest.mark.parametrize("agent, replies, answer", [
    ("opera", {"plan": ['{"subgoals": ["Who directed Inception?"]}'],
               "analysis": ['{"reasoning": "p1 says so", "sufficient": true, "answer": "Christopher Nolan"}'],
               "rewrite": ['{"query": "x"}'], "answer": ["Christopher Nolan"]}, "Christopher Nolan"),
    ("mujica", {"planner": ['<think>One lookup.</think>\n{"subquestions": [{"id": "q1", "question": "Who directed '
                            'Inception?", "depends_on": []}]}',
                            '<think>q1 says.</think>\n{"answer": "Christopher Nolan"}'],
                "worker": ['<think>[1].</think>{"relevant": [1, 1, 9], "answer": "Christopher Nolan"}']},
     "Christopher Nolan"),
])
def test_the_designs_read_held_replies_as_their_models(agent, replies, answer, tmp_path):
    """OPERA and Mujica under a grammar that held every reply: each role reads its model, not the alias tables."""
    from mhqa_graph.store import open_store
    from mhqa_graph.types import Passage

    with open_store(f"embedded://{tmp_path}/s?embedder=hash") as store:
        store.add_passages("wiki", [Passage("p1", "Inception", "Inception is a film directed by Christopher Nolan.")])
        models = {role: HeldFake(responses=said) for role, said in replies.items()}
        settings = {"min_worker_rounds": 1} if agent == "mujica" else {}
        ctx = make_context(agent, llm=FakeChatModel(responses=["unused"]), role_llms=models, store=store,
                           corpus="wiki", **settings)
        out = build_graph(agent).invoke({"question": "Who directed Inception?"}, context=ctx)
    assert out["answer"] == answer and out["error"] is None
    assert all(g for m in models.values() for g in m.grammars)
    if agent == "mujica":
        assert out["results"]["q1"]["selected"] == [1]  # out of range and repeated numbers dropped
