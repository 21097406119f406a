"""Token log-probabilities: the llama.cpp recorder, the answer's share of them, and rag's confidence (a real
llama.cpp reply's: tests/test_llamacpp.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from langchain_core.messages import AIMessage
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.calls import gives_logprobs

from mhqa_graph.models.llamacpp import LlamaCppChatModel
from mhqa_graph.models.logprobs import TokenLogprobs, answer_logprobs, confidence
from mhqa_graph.testing.fakes import FakeChatModel


def scored(*tokens: tuple[str, float]) -> AIMessage:
    return AIMessage("".join(t for t, _ in tokens), response_metadata={
        "logprobs": {"content": [{"token": t, "logprob": lp} for t, lp in tokens]}})


def test_the_answer_tokens_are_those_inside_the_answer_tag():
    reply = scored(("<think>", -0.1), ("Nolan", -3.0), ("</think>", -0.1), ("\n", -0.2), ("<", -0.5),
                   ("answer", 0.0), (">", -0.1), ("Christopher", -0.7), (" Nolan", -0.05), ("</", -0.4),
                   ("answer", 0.0), (">", -0.2))
    assert answer_logprobs(reply) == [-0.7, -0.05]  # not the think block's "Nolan", nor the tags
    assert confidence(answer_logprobs(reply)) == round(math.exp(-0.7), 4)
    assert answer_logprobs(scored(("Paris", -0.1))) is None  # no answer tag
    assert answer_logprobs(AIMessage("<answer>Paris</answer>")) is None  # no log-probabilities
    assert confidence(None) is None and confidence([]) is None


def test_the_recorder_scores_each_token_under_the_models_own_distribution():
    recorder = TokenLogprobs()
    logits = np.array([2.0, 1.0, 0.0], dtype=np.float32)
    assert recorder(np.array([7]), logits) is logits  # the logits pass unchanged: the reply is the same
    recorder(np.array([7, 1]), logits)  # token 1 was chosen at the first step
    recorder(np.array([7, 1, 0]), logits)  # then token 0
    expected = np.log(np.exp(logits) / np.exp(logits).sum())
    assert recorder.ids == [1, 0] and recorder.logprobs == pytest.approx([expected[1], expected[0]], abs=1e-6)
    assert recorder.content(lambda i: f"t{i}".encode()) == [{"token": f"t{i}", "logprob": round(float(expected[i]), 4)}
                                                            for i in (1, 0)]


def test_which_backends_give_log_probabilities():
    assert LlamaCppChatModel.accepts_logprobs
    assert gives_logprobs(FakeChatModel(logprob=-0.5)) and not gives_logprobs(FakeChatModel())


@pytest.mark.parametrize("logprob, expected", [(-0.5, round(math.exp(-0.5), 4)), (None, None)])
def test_rag_reports_its_confidence_only_when_asked(tmp_path, logprob, expected):
    from mhqa_graph.store import open_store
    from mhqa_graph.types import Passage

    store = open_store(f"embedded://{tmp_path}/s?embedder=hash")
    store.add_passages("wiki", [Passage("p1", "Inception", "Inception was directed by Christopher Nolan.")])
    model = FakeChatModel(responses=["<think>p1</think><answer>Christopher Nolan</answer>"], logprob=logprob)
    ask = {"question": "Who directed Inception?"}
    out = build_graph("rag").invoke(ask, context=make_context("rag", llm=model, store=store, corpus="wiki",
                                                              confidence=True))
    assert out["answer"] == "Christopher Nolan" and out["confidence"] == expected
    assert out["answer_logprobs"] == (None if logprob is None else [logprob])
    plain = build_graph("rag").invoke(ask, context=make_context("rag", llm=model, store=store, corpus="wiki"))
    assert "confidence" not in plain
    store.close()
