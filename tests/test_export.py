"""Export of eval runs to training datasets: sft chats with loss weights (round trip through
`datasets.load_from_disk` and a chat template), OPERA role datasets, GRPO prompts, MyGO filtering and
dedup, plain-state traces, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from mhqa_graph.graphs import build_graph
from mhqa_graph.graphs.mujica.state import MujicaContext
from mhqa_graph.graphs.opera import OperaContext
from test_traces import (  # noqa: F401
    QUESTION,
    analysis,
    mujica_models,
    opera_roles,
    run_mujica,
    run_omne,
    run_opera,
    store,
)

from mhqa_graph import traces
from mhqa_graph.eval.scoring import score
from mhqa_graph.export import (
    OPERA_ROLES,
    ExtraNotInstalled,
    clean_messages,
    clean_turns,
    conversations,
    export,
    segments,
    tokenize_with_weights,
    trace_kinds,
    weighted_message,
)
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.traces import TraceError, run_with_trace

datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def record(qid: str, question: str, gold: list[str], output: dict, trace, **extra) -> dict:
    em, f1 = score(output.get("answer") or "", gold)
    return {"id": qid, "question": question, "answers": gold, "prediction": output.get("answer") or "", "em": em,
            "f1": f1, "error": output.get("error"), "latency": 0.1, "llm_calls": len(trace.llm_calls),
            "tokens": trace.usage()["tokens"], "type": "bridge", "hops": 2,
            "trace": trace.model_dump(mode="json"), **extra}


@pytest.fixture(scope="module")
def run_dir(store, tmp_path_factory):  # noqa: F811
    """A run of five records: OPERA right and wrong, Omne twice (identical), Mujica."""
    gold, support = ["London"], {"supporting_ids": ["inception", "nolan"],
                                 "supporting_titles": ["Inception", "Christopher Nolan"]}
    opera_out, opera_trace, _ = run_opera(store)
    wrong_out, wrong_trace, _ = run_opera(store, final="Paris")
    omne_out, omne_trace, _ = run_omne(store)
    mujica_out, mujica_trace = run_mujica(store)
    records = [record("hp1", opera_trace.question, gold, opera_out, opera_trace, **support),
               record("hp2", wrong_trace.question, gold, wrong_out, wrong_trace, **support),
               record("wk1", omne_trace.question, gold, omne_out, omne_trace, topic_entities=["Inception"]),
               record("wk1", omne_trace.question, gold, omne_out, omne_trace, topic_entities=["Inception"]),
               record("mu1", mujica_trace.question, ["Paris, Berlin and Rome"], mujica_out, mujica_trace)]
    path = tmp_path_factory.mktemp("runs") / "demo"
    path.mkdir()
    lines = [json.dumps(r) for r in records]
    (path / "results.jsonl").write_text("\n".join(lines) + '\n{"id": "torn', encoding="utf-8")
    return path


def tiny_tokenizer(texts: list[str]):
    """A word-level fast tokenizer trained on `texts`, with a ChatML-like template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    specials = ["[UNK]", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts + ["system user assistant tool"], trainers.WordLevelTrainer(special_tokens=specials))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<|im_end|>",
                                                additional_special_tokens=specials[1:])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def expected_trained_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The agent tokens: each assistant turn's own tokens and its end-of-turn token."""
    ids = []
    for m in messages:
        if m["role"] == "assistant":
            ids += tokenizer(m["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return ids


# -- sft -------------------------------------------------------------------------------------------
def test_segments_split_thinking_from_actions():
    text = "<think>look it up</think>\n<tool_call>{}</tool_call>"
    assert segments(text) == [{"text": "<think>", "weight": 1.0}, {"text": "look it up", "weight": 0.001},
                              {"text": "</think>", "weight": 1.0},
                              {"text": "\n<tool_call>{}</tool_call>", "weight": 1.0}]
    assert segments("plain", 0.1) == [{"text": "plain", "weight": 1.0}]
    assert segments("<think>cut off", 0.1) == [{"text": "<think>", "weight": 1.0}, {"text": "cut off", "weight": 0.1}]
    assert segments("<answer>x</answer>") == [{"text": "<answer>x</answer>", "weight": 1.0}]


def test_conversations_chain_calls_that_extend_each_other(store):  # noqa: F811
    _, omne_trace, _ = run_omne(store)
    [(roles, turns)] = conversations(omne_trace)
    assert roles == ["tool-agent"] and [t[0] for t in turns].count("assistant") == 4
    _, opera_trace, _ = run_opera(store)
    assert len(conversations(opera_trace)) == len(opera_trace.llm_calls) == 6  # fresh prompts each
    _, mujica_trace = run_mujica(store)  # the planner keeps one conversation; each worker call is its own
    assert [roles for roles, _ in conversations(mujica_trace)].count(["planner"]) == 1
    assert len(conversations(mujica_trace)) == 1 + 3


def test_a_send_back_that_left_the_reply_out_continues_its_conversation_without_that_reply(store):  # noqa: F811
    """Mujica's `conclusion_ungrounded` asks again without showing the rejected conclusion: the export keeps one
    planner conversation, going from the prompt to the reply that was used."""
    _, worker = mujica_models()
    plans = iter([{"subquestions": [{"id": "q1", "question": "What is the capital of France?", "depends_on": []}]},
                  {"answer": "Lyon"}, {"answer": "Paris"}])
    planner = FakeChatModel(respond=lambda m: json.dumps(next(plans)))
    context = MujicaContext(role_llms={"planner": planner, "worker": worker}, store=store, corpus="wiki",
                            guards="+conclusion_ungrounded")
    out, trace = run_with_trace(build_graph("mujica"), "mujica", "What is the capital of France?", context)
    assert out["answer"] == "Paris" and len(planner.calls) == 3
    assert all(m.type != "ai" or "Lyon" not in m.text for m in planner.calls[2])  # the rejected reply is not shown
    [planner_turns] = [turns for roles, turns in conversations(trace) if roles == ["planner"]]
    kept = clean_turns(planner_turns, trace_kinds(trace))
    assert [who for who, _ in kept][-2:] == ["user", "assistant"] and '"Paris"' in kept[-1][1]
    assert not any("Lyon" in text or "could not be used" in text for _, text in kept)
    # two send-backs in a row (a bridge answer, then one no worker gave): still one conversation, the used reply last
    plans = iter([{"subquestions": [{"id": "q1", "question": "What is the capital of France?", "depends_on": []},
                                    {"id": "q2", "question": "What is the capital of Germany, after #q1?",
                                     "depends_on": ["q1"]}]},
                  {"answer": "Paris"}, {"answer": "Lyon"}, {"answer": "Berlin"}])
    planner = FakeChatModel(respond=lambda m: json.dumps(next(plans)))
    context = MujicaContext(role_llms={"planner": planner, "worker": worker}, store=store, corpus="wiki",
                            guards="+conclusion_bridge,+conclusion_ungrounded")
    out, trace = run_with_trace(build_graph("mujica"), "mujica", "What is the capital of Germany?", context)
    assert out["answer"] == "Berlin" and [f["guard"] for f in out["guards"]] == ["conclusion_bridge",
                                                                                 "conclusion_ungrounded"]
    [planner_turns] = [turns for roles, turns in conversations(trace) if roles == ["planner"]]
    kept = clean_turns(planner_turns, trace_kinds(trace))
    assert '"Berlin"' in kept[-1][1] and not any(w in text for _, text in kept for w in ('"Paris"', "Lyon"))


def test_sft_export_weights_only_agent_turns(run_dir, tmp_path):
    assert export(run_dir, "sft", tmp_path / "sft") == {"sft": 6 + 6 + 1 + 1 + 4}
    ds = datasets.load_from_disk(str(tmp_path / "sft"))
    rows = [json.loads(line) for line in (tmp_path / "sft" / "sft.jsonl").read_text().splitlines()]
    assert ds.to_list() == rows
    omne = next(r for r in rows if r["agent"] == "omne")
    assert omne["roles"] == ["tool-agent"] and omne["reward"] == 1.0
    for m in omne["messages"]:
        assert "".join(s["text"] for s in m["segments"]) == m["content"]
        if m["role"] == "assistant":
            assert m["weight"] == 1.0 and {s["weight"] for s in m["segments"]} <= {0.001, 1.0}
        else:
            assert m["weight"] == 0.0 and all(s["weight"] == 0.0 for s in m["segments"])
    tool_results = [m for m in omne["messages"] if m["content"].startswith("<tool_response>")]
    assert len(tool_results) == 3 and all(m["role"] == "user" for m in tool_results)
    first_action = next(m for m in omne["messages"] if m["role"] == "assistant")
    assert [s["weight"] for s in first_action["segments"]] == [1.0, 0.001, 1.0, 1.0]  # <think>, thought, </think>


def test_round_trip_mask_marks_exactly_the_agent_tokens(run_dir, tmp_path):
    export(run_dir, "sft", tmp_path / "sft", think_weight=0.01)
    ds = datasets.load_from_disk(str(tmp_path / "sft"))
    tokenizer = tiny_tokenizer([m["content"] for row in ds for m in row["messages"]])
    for row in ds:
        ids, weights = tokenize_with_weights(tokenizer, row["messages"])
        assert len(ids) == len(weights) and tokenizer.unk_token_id not in ids
        assert [i for i, w in zip(ids, weights) if w > 0] == expected_trained_ids(tokenizer, row["messages"])
        thinking = [s["text"] for m in row["messages"] for s in m["segments"] if s["weight"] == 0.01]
        n_think = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in thinking)
        if row["agent"] == "omne":  # a token across a tag and a thought takes the tag's 1.0
            assert 0 < weights.count(0.01) <= n_think
            assert set(weights) == {0.0, 0.01, 1.0}


def test_round_trip_with_a_real_chat_template(run_dir, tmp_path):
    from mhqa_graph.models.packs import pack_path

    folder = pack_path("smollm2-135m")
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("the smollm2-135m pack is not pulled")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    export(run_dir, "sft", tmp_path / "sft")
    row = next(r for r in datasets.load_from_disk(str(tmp_path / "sft")) if r["agent"] == "omne")
    ids, weights = tokenize_with_weights(tokenizer, row["messages"])
    trained = tokenizer.decode([i for i, w in zip(ids, weights) if w == 1.0])
    assert trained.count("<tool_call>") == 3 and "<answer>London</answer>" in trained
    assert "<tool_response>" not in trained and "You are" not in trained
    assert trained.count(tokenizer.eos_token) == 4
    thought = tokenizer.decode([i for i, w in zip(ids, weights) if 0 < w < 1])
    assert "Find the film." in thought and "<tool_call>" not in thought


def test_min_reward_filters_trajectories(run_dir, tmp_path):
    counts = export(run_dir, "sft", tmp_path / "sft", min_reward=1.0, reward="em")
    assert counts == {"sft": 6 + 1 + 1 + 4}  # the wrong OPERA run is out
    assert {r["id"] for r in datasets.load_from_disk(str(tmp_path / "sft"))} == {"hp1", "wk1", "mu1"}


# -- mygo ------------------------------------------------------------------------------------------
def test_mygo_keeps_good_trajectories_once(run_dir, tmp_path):
    assert export(run_dir, "mygo", tmp_path / "mygo") == {"mygo": 6 + 1 + 4}  # default threshold 1.0, wk1 once
    rows = datasets.load_from_disk(str(tmp_path / "mygo")).to_list()
    assert sorted({r["id"] for r in rows}) == ["hp1", "mu1", "wk1"] and all(r["reward"] >= 1.0 for r in rows)
    assert export(run_dir, "mygo", tmp_path / "all", min_reward=0.0) == {"mygo": 6 + 6 + 1 + 4}


# -- roles -----------------------------------------------------------------------------------------
def test_roles_export_pairs_each_call_with_its_signals(run_dir, tmp_path):
    assert export(run_dir, "roles", tmp_path / "roles") == {"plan": 2, "analysis": 6, "rewrite": 2}
    dd = datasets.load_from_disk(str(tmp_path / "roles"))
    assert set(dd) == {"plan", "analysis", "rewrite"}
    plan = dd["plan"][0]
    assert plan["plan"] == ["Who directed Inception?", "Where was [Answer1] born?"]
    assert [m["role"] for m in plan["prompt"]] == ["system", "user"] and plan["completion"][0]["role"] == "assistant"
    assert plan["answers"] == ["London"] and plan["supporting_ids"] == ["inception", "nolan"]
    analysis = [r for r in dd["analysis"] if r["id"] == "hp1"]
    assert [r["sufficient"] for r in analysis] == [False, True, True]
    assert [r["query"] for r in analysis] == ["Who directed Inception?", "Inception film director",
                                              "Where was Christopher Nolan born?"]
    assert analysis[2]["step_answer"] == "London" and "nolan" in analysis[2]["retrieved_ids"]
    # OPERA shows a sub-goal's later attempt the passages of its earlier ones too
    assert set(analysis[0]["shown_ids"]) == set(analysis[0]["retrieved_ids"])
    assert set(analysis[1]["shown_ids"]) == set(analysis[0]["retrieved_ids"]) | set(analysis[1]["retrieved_ids"])
    assert analysis[0]["subgoal"] == "Who directed Inception?"
    rewrite = dd["rewrite"][0]
    assert rewrite["query"] == "Who directed Inception?" and rewrite["rewrite"] == "Inception film director"
    assert rewrite["next_retrieved_ids"] and rewrite["retrieved_ids"]
    assert rewrite["completion"][0]["content"] == '{"query": "Inception film director"}'
    assert {r["reward"] for r in dd["plan"]} == {0.0, 1.0}
    assert (tmp_path / "roles" / "rewrite.jsonl").is_file()


# -- grpo ------------------------------------------------------------------------------------------
def test_grpo_prompts_one_per_question_even_from_plain_states(run_dir, tmp_path):
    lines = (run_dir / "results.jsonl").read_text().splitlines()[:-1]
    plain = json.loads(lines[0]) | {"id": "old1", "trace": {"answer": "London", "plan": ["a"], "steps": []}}
    (tmp_path / "results.jsonl").write_text("\n".join([*lines, json.dumps(plain)]) + "\n")
    assert export(tmp_path, "grpo", tmp_path / "grpo") == {"grpo": 5}
    rows = {r["id"]: r for r in datasets.load_from_disk(str(tmp_path / "grpo"))}
    assert set(rows) == {"hp1", "hp2", "wk1", "mu1", "old1"}
    assert rows["wk1"]["topic_entities"] == ["Inception"] and rows["wk1"]["graph"] == "films"
    assert rows["hp1"]["corpus"] == "wiki" and rows["hp1"]["answers"] == ["London"] and rows["hp1"]["hops"] == 2
    assert rows["hp1"]["prompt"] == [{"role": "user", "content": rows["hp1"]["question"]}]
    assert rows["old1"]["corpus"] is None
    with pytest.raises(TraceError, match="plain run state"):
        export(tmp_path, "sft", tmp_path / "sft")


# -- errors and the CLI ------------------------------------------------------------------------------
def test_bad_inputs_are_typed_errors(run_dir, tmp_path, monkeypatch):
    with pytest.raises(TraceError, match="unknown format"):
        export(run_dir, "dpo", tmp_path / "x")
    with pytest.raises(TraceError, match="unknown reward"):
        export(run_dir, "sft", tmp_path / "x", reward="bleu")
    with pytest.raises(TraceError, match="no results file"):
        export(tmp_path / "nowhere", "sft", tmp_path / "x")
    (tmp_path / "bad.jsonl").write_text('not json\n{"id": "a"}\n')
    with pytest.raises(TraceError, match="bad.jsonl:1"):
        export(tmp_path / "bad.jsonl", "sft", tmp_path / "x")
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ExtraNotInstalled, match=r"pip install 'mhqa-graph\[train\]'"):
        export(run_dir, "sft", tmp_path / "x")


def test_template_that_rewrites_messages_is_refused():
    tokenizer = tiny_tokenizer(["hello there"])
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"
    with pytest.raises(ValueError, match="chat template alters it"):
        tokenize_with_weights(tokenizer, [{"role": "user", "content": "hello there"}])


def test_cli_export(run_dir, tmp_path):
    cmd = [sys.executable, "-m", "mhqa_graph.cli", "export", str(run_dir), "--out", str(tmp_path / "m")]
    done = subprocess.run([*cmd, "--format", "mygo", "--min-reward", "0.5"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "mygo: 11 rows" in done.stdout and (tmp_path / "m" / "mygo.jsonl").is_file()
    bad = subprocess.run([*cmd, "--format", "dpo"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "TraceError: unknown format" in bad.stderr and "Traceback" not in bad.stderr


def test_roles_match_identical_replies_to_their_own_attempts(store, tmp_path):  # noqa: F811
    roles = opera_roles()
    no = analysis("", False)
    roles["analysis"] = FakeChatModel(responses=[no, no, analysis("Christopher Nolan"), analysis("London")])
    ctx = OperaContext(llm=FakeChatModel(responses=["x"]), role_llms=roles, store=store, corpus="wiki")
    out, trace = run_with_trace(build_graph("opera"), "opera", QUESTION, ctx)
    (tmp_path / "results.jsonl").write_text(json.dumps(record("q", QUESTION, ["London"], out, trace)) + "\n")
    export(tmp_path, "roles", tmp_path / "roles")
    rows = datasets.load_from_disk(str(tmp_path / "roles"))["analysis"]
    assert [r["query"] for r in rows][:3] == ["Who directed Inception?", "Inception film director",
                                              "Inception film director"]
    assert [r["sufficient"] for r in rows] == [False, False, True, True]


# -- repairs are no targets ------------------------------------------------------------------------
def one_record_run(tmp_path, qid: str, out: dict, trace) -> str:
    (tmp_path / "results.jsonl").write_text(json.dumps(record(qid, trace.question, ["London"], out, trace)) + "\n")
    return str(tmp_path)


def trained_texts(row: dict) -> list[str]:
    return [m["content"] for m in row["messages"] if m["weight"] > 0]


def test_a_repaired_reply_and_its_repair_message_weigh_nothing(store, tmp_path):  # noqa: F811
    """OPERA's analysis agent first writes no JSON; ask_json shows it the problem and it replies again. The
    sft/mygo chat of that call goes from the prompt straight to the good reply."""
    roles = opera_roles()
    bad = "The passages say Nolan directed it."
    roles["analysis"] = FakeChatModel(responses=[bad, analysis("Christopher Nolan"), analysis("London")], cycle=False)
    ctx = OperaContext(llm=FakeChatModel(responses=["x"]), role_llms=roles, store=store, corpus="wiki")
    out, trace = run_with_trace(build_graph("opera"), "opera", QUESTION, ctx)
    repair = trace.llm_calls[2]
    assert [m.role for m in repair.messages][-2:] == ["assistant", "user"]  # the real repair exchange
    assert repair.messages[-2].content == bad and repair.messages[-1].content.startswith("That reply could not be used")
    run = one_record_run(tmp_path, "hp1", out, trace)
    for fmt in ("sft", "mygo"):
        export(run, fmt, tmp_path / fmt)
        rows = datasets.load_from_disk(str(tmp_path / fmt)).to_list()
        texts = [m["content"] for r in rows for m in r["messages"]]
        assert bad not in texts and not any(t.startswith("That reply could not be used") for t in texts)
        repaired = next(r for r in rows if r["roles"] == ["analysis"])
        assert [m["role"] for m in repaired["messages"]] == ["system", "user", "assistant"]
        assert trained_texts(repaired) == [analysis("Christopher Nolan")]


def test_omne_nudges_and_replies_without_action_weigh_nothing(store, tmp_path):  # noqa: F811
    from mhqa_graph.graphs.omne.prompts import FORCE_ANSWER, NUDGE
    from test_traces import OMNE_SCRIPT, run_omne

    idle = "<think>Let me think about the director.</think>"
    script = [OMNE_SCRIPT[0], idle, OMNE_SCRIPT[1], idle + " Hmm.", "<think>So.</think><answer>London</answer>"]
    out, trace, _ = run_omne(store, script=script)
    [(_, turns)] = conversations(trace)
    assert ("user", NUDGE) in turns and ("user", FORCE_ANSWER) in turns  # nudged once, then forced to answer
    run = one_record_run(tmp_path, "wk1", out, trace)
    export(run, "sft", tmp_path / "sft")
    [row] = datasets.load_from_disk(str(tmp_path / "sft")).to_list()
    contents = [m["content"] for m in row["messages"]]
    assert NUDGE not in contents and not any(c.startswith(idle) for c in contents)
    assert FORCE_ANSWER in contents  # the forced answer replies to it
    assert trained_texts(row) == [OMNE_SCRIPT[0], OMNE_SCRIPT[1], "<think>So.</think><answer>London</answer>"]
    # the weighted-SFT tokeniser cleans rows exported before the cleaning existed
    raw = [weighted_message(who, text) for who, text in turns]
    assert clean_messages(raw) == row["messages"]


def test_omne_answers_sent_back_weigh_nothing(store, tmp_path):  # noqa: F811
    """An answer that Omne sent back (here: a made-up one) is no target; the one that stood is."""
    from mhqa_graph.graphs.omne.prompts import UNGROUNDED
    from test_traces import OMNE_SCRIPT, run_omne

    script = [*OMNE_SCRIPT[:3], "<answer>Paris</answer>", OMNE_SCRIPT[3]]
    out, trace, _ = run_omne(store, script=script)
    [(_, turns)] = conversations(trace)
    assert ("user", UNGROUNDED.format(answer="Paris")) in turns and out["answer"] == "London"
    run = one_record_run(tmp_path, "wk2", out, trace)
    export(run, "sft", tmp_path / "sft")
    [row] = datasets.load_from_disk(str(tmp_path / "sft")).to_list()
    assert trained_texts(row) == OMNE_SCRIPT
    assert not any("Paris" in m["content"] for m in row["messages"])


def test_a_call_written_in_the_models_place_weighs_nothing(store, tmp_path):  # noqa: F811
    """Omne handed its start (`start_from`, auto's hand-over): the node_info turn the system wrote is context in the
    exported chat, the model's own replies are the targets."""
    from mhqa_graph.graphs.omne import OmneContext
    from test_traces import OMNE_SCRIPT

    model = FakeChatModel(responses=OMNE_SCRIPT[2:], cycle=False)
    graph = build_graph("omne")
    ctx = OmneContext(llm=model, store=store, graph="films")
    recorder = traces.TraceRecorder("omne", ctx)
    out = graph.invoke({"question": QUESTION, "start_from": ["Inception"]}, {"callbacks": [recorder]}, context=ctx)
    trace = recorder.trace(out)
    run = one_record_run(tmp_path, "ho1", out, trace)
    export(run, "sft", tmp_path / "sft")
    [row] = datasets.load_from_disk(str(tmp_path / "sft")).to_list()
    handed = [m for m in row["messages"] if m["role"] == "assistant" and '"entity": "Inception"' in m["content"]]
    assert len(handed) == 1 and handed[0]["weight"] == 0.0
    assert trained_texts(row) == OMNE_SCRIPT[2:]


def test_omne_replies_cut_after_their_last_call_still_chain(store):  # noqa: F811
    """The Omne graph keeps a reply only through its last call; the next call's input holds that cut
    reply, and the chat continues with it (the text after the call is no target)."""
    from test_traces import OMNE_SCRIPT, run_omne

    chatty = [OMNE_SCRIPT[0] + "\nNow I wait for the result.", *OMNE_SCRIPT[1:]]
    _, trace, _ = run_omne(store, script=chatty)
    [(_, turns)] = conversations(trace)
    replies = [text for who, text in turns if who == "assistant"]
    assert replies[0] == OMNE_SCRIPT[0] and len(replies) == 4


def test_trajectories_a_guard_changed_are_no_targets(store, tmp_path):  # noqa: F811
    """A guard-replaced answer is the code's, not the model's: no sft or mygo row. A send-back (the guard changed
    the run, the model answered) stays an sft row but is no mygo row, which selects by reward."""
    from mhqa_graph.graphs.guards import OPTION_ANSWER, firing
    from test_traces import OMNE_SCRIPT, run_omne

    from mhqa_graph.export import mygo_rows, sft_rows

    out, trace, _ = run_omne(store, script=[*OMNE_SCRIPT[:3], "<answer>Paris</answer>", OMNE_SCRIPT[3]])
    sent_back = record("wk2", trace.question, ["London"], out, trace)
    assert [f["guard"] for f in trace.design["guards"]] == ["send_back_ungrounded"]
    replaced = json.loads(json.dumps(sent_back))
    replaced["trace"]["design"]["guards"].append(firing(OPTION_ANSWER, "Christopher Nolan", "London", True))
    logged = json.loads(json.dumps(sent_back))
    logged["trace"]["design"]["guards"] = [firing(OPTION_ANSWER, "Christopher Nolan", "London", False)]
    assert [len(sft_rows([r])) for r in (sent_back, replaced, logged)] == [1, 0, 1]
    assert [len(mygo_rows([r])) for r in (sent_back, replaced, logged)] == [0, 0, 1]


def test_calls_the_trace_clipped_are_no_targets(store, tmp_path, monkeypatch):  # noqa: F811
    """A call whose prompt or reply the trace did not keep whole gives no sft or roles row; every other call
    gives the row it gives unclipped."""
    out, whole, _ = run_opera(store)
    longest = [max(len(t) for t in [c.output, *(m.content for m in c.messages)]) for c in whole.llm_calls]
    limit = sorted(longest)[len(longest) // 2]
    monkeypatch.setattr(traces, "MAX_TRACE_TEXT", limit)
    _, clipped, _ = run_opera(store)
    assert [c.clipped_chars > 0 for c in clipped.llm_calls] == [n > limit for n in longest]
    assert clipped.clipped_chars >= sum(c.clipped_chars for c in clipped.llm_calls) > 0
    rows = {}
    for name, trace in (("whole", whole), ("clipped", clipped)):
        (tmp_path / name).mkdir()
        run = one_record_run(tmp_path / name, "hp1", out, trace)
        export(run, "sft", tmp_path / name / "sft")
        export(run, "roles", tmp_path / name / "roles")
        sft = [r | {"conversation": 0} for r in datasets.load_from_disk(str(tmp_path / name / "sft")).to_list()]
        roles = datasets.load_from_disk(str(tmp_path / name / "roles"))
        rows[name] = sft, [r for split in roles.values() for r in split.to_list()]
    kept = [call.role for call, n in zip(whole.llm_calls, longest) if n <= limit]
    assert [r["roles"] for r in rows["clipped"][0]] == [[role] for role in kept]
    assert all(r in rows["whole"][0] for r in rows["clipped"][0])
    assert len(rows["clipped"][1]) == sum(r in OPERA_ROLES for r in kept)
    assert all(r in rows["whole"][1] for r in rows["clipped"][1])


@pytest.mark.parametrize("name", ["sft.jsonl", "dataset_info.json"])
def test_a_symlink_planted_in_the_out_folder_is_refused_and_its_target_untouched(run_dir, tmp_path, name):
    """`mhqa export` wrote `<out>/sft.jsonl` through a link planted there (issue 65, the rest of D8); each file it
    makes is now made afresh (O_EXCL, O_NOFOLLOW), and a link in the folder is refused before anything is written."""
    target, out = tmp_path / "precious.txt", tmp_path / "ds"
    target.write_text("keep", encoding="utf-8")
    out.mkdir()
    (out / name).symlink_to(target)
    cmd = [sys.executable, "-m", "mhqa_graph.cli", "export", str(run_dir), "--format", "sft", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr) == (2, f"error: InvalidInput: {out / name} is a symbolic link; an export "
                                                 "writes no file through one: remove it, or use another --out\n")
    assert target.read_text(encoding="utf-8") == "keep" and sorted(p.name for p in out.iterdir()) == [name]
    (out / name).unlink()
    assert export(run_dir, "sft", out)["sft"] > 0 and not (out / name).is_symlink()
