"""Seeded sampling: a chat model given `seed` samples call n with seed + n, so a run of sampled calls (rollouts)
is reproducible, while calls within it differ; greedy calls and the process's random state are untouched."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


def tiny_chat(**kwargs):
    from mhqa_graph.training.tiny import tiny_model_and_tokenizer

    from mhqa_graph.models.chat import TransformersChatModel

    model, tokenizer = tiny_model_and_tokenizer()
    return TransformersChatModel.from_loaded(model, tokenizer, model_name="tiny", max_new_tokens=12, **kwargs)


def replies(model, n=3):
    return [model.invoke("Who directed Inception?").text for _ in range(n)]


def test_a_seeded_run_of_sampled_calls_repeats_and_its_calls_differ():
    import torch

    model = tiny_chat(temperature=1.0, seed=7)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = replies(model)
    assert torch.rand(1) == before  # the process's random state is as it was
    assert replies(tiny_chat(temperature=1.0, seed=7)) == first
    assert len(set(first)) > 1  # call n samples with seed + n: a group of samples is not one sample repeated
    assert replies(tiny_chat(temperature=1.0, seed=8)) != first


def test_the_server_model_sends_a_seed_per_call():
    from mhqa_graph.models.server import LlamaServerChatModel

    model = LlamaServerChatModel(base_url="http://127.0.0.1:1/v1", model="m", api_key="EMPTY", seed=5)
    assert [model._request({})["seed"] for _ in range(3)] == [5, 6, 7]
    assert "seed" not in LlamaServerChatModel(base_url="http://127.0.0.1:1/v1", model="m", api_key="EMPTY")._request({})
