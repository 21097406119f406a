"""Our model calls use no deprecated API: a retried call runs with every warning turned into an error."""

from __future__ import annotations

import warnings

from langchain_core.messages import HumanMessage
from mhqa_graph.graphs.calls import ask, get_llm
from mhqa_graph.graphs.settings import AgentContext

from mhqa_graph.testing.fakes import FakeChatModel


def test_a_retried_model_call_warns_nothing():
    def respond(messages):
        if len(model.calls) == 1:  # the first call times out, the retry answers
            raise TimeoutError("read timed out")
        return "London"

    model = FakeChatModel(respond=respond)
    llm = get_llm(AgentContext(role_llms={"answer": model}, retry_backoff=0.01), "answer")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ask(llm, [HumanMessage("Where was Christopher Nolan born?")]) == "London"
    assert len(model.calls) == 2
