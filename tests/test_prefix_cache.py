"""The prefix cache of llamacpp: models: which state a prompt restores, the byte budget, and with a real
GGUF the same greedy replies as without it, with fewer tokens prefilled."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from mhqa_graph.models.packs import pack_installed
from mhqa_graph.models.prefix_cache import PrefixCache, common_prefix

try:
    import llama_cpp  # noqa: F401

    HAS_SMOLLM = pack_installed("smollm2-135m")
except ImportError:
    HAS_SMOLLM = False


def test_the_longest_shared_prefix_wins_and_becomes_the_most_recent():
    cache = PrefixCache(capacity=100)
    cache.put([1, 2, 3, 4], b"a" * 10)
    cache.put([1, 2, 9], b"b" * 10)
    cache.put([7, 8], b"c" * 10)
    assert cache.longest([1, 2, 3, 5]) == ((1, 2, 3, 4), b"a" * 10, 3)
    assert cache.longest([1, 2, 9, 9])[2] == 3 and cache.longest([5]) is None
    assert common_prefix([1, 2, 3], [1, 2]) == 2 and common_prefix([], [1]) == 0


def test_the_budget_drops_the_least_recently_used_and_prefixes_of_newer_sequences():
    cache = PrefixCache(capacity=30)
    cache.put([1], b"x" * 10)
    cache.put([1, 2], b"y" * 12)  # holds [1]: the shorter one goes
    assert len(cache) == 1 and cache.size == 12
    cache.put([1], b"z" * 5)  # held by [1, 2]: not kept
    assert len(cache) == 1 and cache.longest([1, 5])[0] == (1, 2)
    cache.put([3], b"w" * 10)
    cache.longest([1, 2])  # [1, 2] used last
    cache.put([4], b"v" * 10)  # 32 bytes: the least recently used, [3], goes
    assert cache.longest([3]) is None and cache.longest([1, 2]) and cache.longest([4]) and cache.size == 22
    cache.put([5], b"u" * 31)  # larger than the whole budget: not kept, nothing dropped
    assert cache.longest([5]) is None and len(cache) == 2


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM, reason="needs llama-cpp-python and the smollm2-135m pack")
def test_alternating_prompts_restore_their_prefix_and_reply_as_without_the_cache():
    """Two roles with long system prompts take turns, as Mujica's planner and workers do: with the cache each
    call prefills only its new tail, and the greedy replies are those of a model without it."""
    from mhqa_graph.models.factory import load_chat_model

    system = {role: f"You are the {role}. " + " ".join(f"Rule {i}: be {role}-like." for i in range(40))
              for role in ("planner", "worker")}
    turns = [(role, f"Question {n}: what is {n} + {n}?") for n in range(3) for role in ("planner", "worker")]

    def run(spec):
        model = load_chat_model(spec, max_new_tokens=8)
        replies = [model.invoke([SystemMessage(system[role]), HumanMessage(text)]) for role, text in turns]
        return [r.text for r in replies], [r.usage_metadata["input_token_details"]["cache_read"] for r in replies]

    plain, plain_read = run("llamacpp:smollm2-135m?threads=1&cache=0")
    cached, cached_read = run("llamacpp:smollm2-135m?threads=1")
    assert cached == plain
    assert all(n < 20 for n in plain_read[1:])  # alternating roles share only the template's first tokens
    assert all(n > 150 for n in cached_read[2:])  # each role's system prompt restored from two calls back


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM, reason="needs llama-cpp-python and the smollm2-135m pack")
def test_a_state_llama_cpp_refuses_is_prefilled_in_full_dropped_and_counted(monkeypatch):
    """A cached state that cannot be restored (a corrupt entry, another model's) costs a full prefill, not a
    wrong reply: the reply is the one without the cache, the call says why, and the entry is gone."""
    from llama_cpp import llama_cpp as api

    from mhqa_graph.models.factory import load_chat_model
    from mhqa_graph.traces import TraceRecorder

    system = SystemMessage("You are the planner. " + " ".join(f"Rule {i}: be brief." for i in range(40)))
    other = SystemMessage("You are the worker. " + " ".join(f"Rule {i}: be exact." for i in range(40)))
    chats = [[system, HumanMessage("What is 1 + 1?")], [other, HumanMessage("What is 2 + 2?")],
             [system, HumanMessage("What is 3 + 3?")]]
    plain = [load_chat_model("llamacpp:smollm2-135m?threads=1&cache=0", max_new_tokens=8).invoke(c).text
             for c in chats]
    model = load_chat_model("llamacpp:smollm2-135m?threads=1", max_new_tokens=8)
    replies = [model.invoke(c) for c in chats[:2]]
    first, second = list(model._cache._states)
    refused = model._cache._states[first]
    monkeypatch.setattr(api, "llama_state_seq_set_data", lambda *args: 0)
    recorder = TraceRecorder("rag")
    replies.append(model.invoke(chats[2], config={"callbacks": [recorder]}))
    assert [r.text for r in replies] == plain
    last = replies[-1]
    assert last.usage_metadata["input_token_details"]["cache_read"] == 0
    assert "prefilled in full" in last.response_metadata["cache_error"]
    assert "prefilled in full" in recorder.calls[-1].cache_error
    kept = model._cache._states  # the refused state dropped, this call's kept (under the same key, if its whole
    assert second in kept and len(kept) == 2 and all(s is not refused for s in kept.values())  # chunks are those)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM, reason="needs llama-cpp-python and the smollm2-135m pack")
@pytest.mark.parametrize("cache", ["", "&cache=0"])
def test_a_prompt_gets_the_same_floats_whatever_ran_before(cache):
    """The repeatability of issue 61: a prompt's reply and its token log-probabilities, to the last bit, are those
    of an empty context, after other prompts that share part of it (restored from the cache or held by the
    context) and after its own reply was decoded into the context."""
    from mhqa_graph.models.factory import load_chat_model

    system = SystemMessage("You answer questions. " + " ".join(f"Rule {i}: cite passage {i}." for i in range(60)))
    chats = [[system, HumanMessage(f"Passage {n}: " + "the river flows north. " * (5 + 7 * n) + "Where?")]
             for n in range(4)]

    def scored(model, chat):
        reply = model.invoke(chat, logprobs=True)
        return reply.text, [t["logprob"] for t in reply.response_metadata["logprobs"]["content"]]

    model = load_chat_model(f"llamacpp:smollm2-135m?threads=1{cache}", max_new_tokens=12)
    fresh = []
    for chat in chats:
        model.forget()
        fresh.append(scored(model, chat))
    model.forget()
    histories = [scored(model, chat) for chat in chats + chats[::-1] + [chats[2], chats[2]]]
    assert histories == fresh + fresh[::-1] + [fresh[2], fresh[2]]
    assert any(n > 0 for n in [model.invoke(chats[1]).usage_metadata["input_token_details"]["cache_read"]])
