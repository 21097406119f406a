"""Weighted SFT on a tiny random Qwen2: equals TRL's SFT loss with weights 1.0, weight-0 tokens get no
gradient, gradient accumulation matches a bigger batch, and real steps on exported rows lower the loss."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("trl")
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from mhqa_graph.training.tiny import tiny_model_and_tokenizer  # noqa: E402
from mhqa_graph.training.weighted_sft import (  # noqa: E402
    IGNORE,
    WeightedCollator,
    WeightedSFTConfig,
    WeightedSFTTrainer,
    tokenize_row,
)
from trl import SFTConfig, SFTTrainer  # noqa: E402

from mhqa_graph.export import THINK_WEIGHT, sft_rows  # noqa: E402
from mhqa_graph.traces import ChatMessage, LLMCall, Trace  # noqa: E402

SYSTEM = "You answer multi-hop questions by exploring a knowledge graph."
TOOL_RESULT = "<tool_response>\nInception --directed_by--> Christopher Nolan\n</tool_response>"


def omne_record(qid: str, question: str, entity: str, answer: str) -> dict:
    """An eval record whose hand-made Omne trace has two model calls: a tool call, then the answer."""
    call = f'<think>I need {entity} first.</think><tool_call>{{"name": "node_info", "arguments": ' \
           f'{{"entity": "{entity}", "graph_type": "kg"}}}}</tool_call>'
    first = [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=f"Question: {question}")]
    second = [*first, ChatMessage(role="assistant", content=call), ChatMessage(role="user", content=TOOL_RESULT)]
    trace = Trace(agent="omne", question=question, answer=answer, llm_calls=[
        LLMCall(role="tool-agent", messages=first, output=call),
        LLMCall(role="tool-agent", messages=second,
                output=f"<think>The fact says it.</think><answer>{answer}</answer>")])
    return {"id": qid, "question": question, "answers": [answer], "prediction": answer, "f1": 1.0, "em": 1.0,
            "trace": trace.model_dump(mode="json")}


RECORDS = [omne_record("q1", "Who directed Inception?", "Inception", "Christopher Nolan"),
           omne_record("q2", "Where was Christopher Nolan born?", "Christopher Nolan", "London"),
           omne_record("q3", "Which graph?", "kg", "kg"),
           omne_record("q4", "What is the name of the tool that returns the facts of one entity?", "node_info",
                       "node info")]


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    out = sft_rows(RECORDS)
    assert len(out) == 4 and all(len(r["messages"]) == 5 for r in out)  # one chat per trajectory
    return out


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_model_and_tokenizer()[1]


def config(tmp_path, cls=WeightedSFTConfig, **kw) -> SFTConfig:
    base = dict(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                disable_tqdm=True, logging_steps=1, max_length=512, seed=0)
    return cls(**(base | kw))


def batch_of(tokenizer, rows: list[dict]) -> dict[str, torch.Tensor]:
    return WeightedCollator(tokenizer.pad_token_id)([tokenize_row(tokenizer, r["messages"]) for r in rows])


def test_tokenized_rows_weight_only_agent_tokens(rows, tokenizer):
    row = tokenize_row(tokenizer, rows[0]["messages"])
    text = lambda w: tokenizer.decode([i for i, x in zip(row["input_ids"], row["loss_weights"]) if x == w])  # noqa: E731
    assert "Christopher Nolan" in text(1.0) and "node_info" in text(1.0) and "<|im_end|>" in text(1.0)
    assert "I need Inception first." in text(THINK_WEIGHT)
    assert "directed_by" in text(0.0) and SYSTEM in text(0.0)
    assert all((lab == IGNORE) == (w == 0) for lab, w in zip(row["labels"], row["loss_weights"]))
    reweighted = tokenize_row(tokenizer, rows[0]["messages"], think_weight=0.5)
    assert THINK_WEIGHT not in reweighted["loss_weights"] and 0.5 in reweighted["loss_weights"]


def test_repaired_replies_in_old_rows_are_not_trained(tokenizer):
    """Rows exported before repairs were cleaned still hold the bad reply and the repair message."""
    from mhqa_graph.export import weighted_message

    bad, good = "Christopher Nolan, I think", '{"sufficient": true, "answer": "Christopher Nolan"}'
    turns = [("system", "Answer in JSON."), ("user", "Who directed Inception?"), ("assistant", bad),
             ("user", "That reply could not be used (no JSON object found in the reply). Reply again with valid JSON."),
             ("assistant", good)]
    row = tokenize_row(tokenizer, [weighted_message(who, text) for who, text in turns])
    trained = tokenizer.decode([i for i, w in zip(row["input_ids"], row["loss_weights"]) if w > 0])
    assert trained == good + "<|im_end|>"
    assert "I think" not in tokenizer.decode(row["input_ids"]) and "could not be used" not in tokenizer.decode(
        row["input_ids"])


def test_all_weights_one_equals_trl_sft_loss(rows, tokenizer, tmp_path):
    model, _ = tiny_model_and_tokenizer(seed=1)
    batch = batch_of(tokenizer, rows)
    batch["loss_weights"] = (batch["labels"] != IGNORE).float()
    ours = WeightedSFTTrainer(copy.deepcopy(model), config(tmp_path / "w"), Dataset.from_list(rows), tokenizer)
    theirs = SFTTrainer(copy.deepcopy(model), args=config(tmp_path / "t", SFTConfig),
                        train_dataset=Dataset.from_list([{"input_ids": [1, 2, 3]}]), processing_class=tokenizer)
    plain = {k: v for k, v in batch.items() if k != "loss_weights"}
    expected = theirs.compute_loss(theirs.model, dict(plain))
    assert ours.compute_loss(ours.model, dict(batch)).item() == pytest.approx(expected.item(), abs=1e-5)
    n = int((batch["labels"][:, 1:] != IGNORE).sum()) + 7  # as under gradient accumulation
    assert ours.compute_loss(ours.model, dict(batch), num_items_in_batch=torch.tensor(n)).item() == pytest.approx(
        theirs.compute_loss(theirs.model, dict(plain), num_items_in_batch=torch.tensor(n)).item(), abs=1e-5)
    # the real weights differ: thinking tokens count 0.001
    weighted = batch_of(tokenizer, rows)
    assert ours.compute_loss(ours.model, weighted).item() < expected.item()


def test_weight_zero_tokens_get_no_gradient(rows, tokenizer, tmp_path):
    model, _ = tiny_model_and_tokenizer(seed=2)
    trainer = WeightedSFTTrainer(model, config(tmp_path), Dataset.from_list(rows), tokenizer)
    batch = batch_of(tokenizer, rows[:2])
    n = torch.tensor(int((batch["labels"][:, 1:] != IGNORE).sum()))

    def grads(labels: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        trainer.compute_loss(model, batch | {"labels": labels}, num_items_in_batch=n).backward()
        return [p.grad.clone() for p in model.parameters()]

    masked = grads(batch["labels"])
    zero = (batch["loss_weights"] == 0) & (batch["attention_mask"] == 1)  # prompts, tool results, template
    assert zero.sum() > 20
    exposed = batch["labels"].clone()
    exposed[zero] = batch["input_ids"][zero]  # now predicted by the model, but at weight 0
    shuffled = exposed.clone()
    shuffled[zero] = torch.randint(0, len(tokenizer), (int(zero.sum()),))
    for labels in (exposed, shuffled):
        assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(masked, grads(labels)))
    changed = batch["labels"].clone()
    one = batch["loss_weights"] == 1.0
    changed[one] = (changed[one] + 1) % len(tokenizer)  # a weighted token's label does matter
    assert not all(torch.allclose(a, b, atol=1e-7) for a, b in zip(masked, grads(changed)))


def test_grad_accumulation_matches_a_bigger_batch(rows, tokenizer, tmp_path):
    model, _ = tiny_model_and_tokenizer(seed=3)
    lengths = {len(tokenize_row(tokenizer, r["messages"])["input_ids"]) for r in rows}
    assert len(lengths) > 1  # rows of different lengths: a mean of per-batch means would differ
    params = {}
    for name, bs, accum in (("big", 4, 1), ("accum", 1, 4)):
        trainer = WeightedSFTTrainer(copy.deepcopy(model), config(tmp_path / name, per_device_train_batch_size=bs,
                                                                  gradient_accumulation_steps=accum, max_steps=1,
                                                                  optim="sgd", learning_rate=1.0, max_grad_norm=0.0),
                                     Dataset.from_list(rows), tokenizer)
        trainer.train()
        params[name] = dict(trainer.model.named_parameters())
    start = dict(model.named_parameters())
    assert any(not torch.allclose(start[k], params["big"][k]) for k in start)
    for k in start:
        torch.testing.assert_close(params["big"][k], params["accum"][k], atol=1e-5, rtol=0)


def test_training_steps_lower_the_loss(rows, tokenizer, tmp_path):
    model, _ = tiny_model_and_tokenizer(seed=4)
    trainer = WeightedSFTTrainer(model, config(tmp_path, per_device_train_batch_size=4, max_steps=2,
                                               learning_rate=1e-2), Dataset.from_list(rows), tokenizer)
    batch = batch_of(tokenizer, rows)
    with torch.no_grad():
        before = trainer.compute_loss(model.eval(), dict(batch)).item()
    trainer.train()
    with torch.no_grad():
        after = trainer.compute_loss(trainer.model.eval(), dict(batch)).item()
    assert after < before
    assert [h["loss"] for h in trainer.state.log_history if "loss" in h]
