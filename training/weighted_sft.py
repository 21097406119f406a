"""SFT with a per-token loss weight (Omne stage 2; plain MLE over agent tokens for MyGO).

Rows are the `sft`/`mygo` export (mhqa_graph.export): chats whose messages carry `segments` [{text,
weight}]. `tokenize_with_weights` gives every token a weight: assistant <think> blocks 0.001 (the
export's `think_weight`, or `WeightedSFTConfig.think_weight` to re-weight), tool calls and answers 1.0,
the end-of-turn token 1.0, prompts, tool results and template text 0. Tokens of weight 0 get the label
-100, so they are not predicted at all. Repaired replies and nudges are dropped first (`clean_messages`),
also from rows exported before the export did it.

    loss = sum_t w_t * CE_t / N,   N = number of tokens with a label (w_t > 0)

N is the count TRL's SFTTrainer divides by, and under gradient accumulation it is Trainer's
`num_items_in_batch` (the label count of all micro-batches of the optimizer step). So with every weight
1.0 the loss is exactly SFTTrainer's, and batch 1 x accumulation 4 gives the gradients of batch 4 x 1.
Dividing by the weight sum instead would make a think-heavy chat's few answer tokens weigh up to 1000x
more than in a chat without thinking; with the count, a thinking token is one token carrying 0.001 of
the loss it would otherwise carry, as in Omne.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from trl import SFTConfig, SFTTrainer

from mhqa_graph.export import clean_messages, segments, tokenize_with_weights

IGNORE = -100


@dataclass
class WeightedSFTConfig(SFTConfig):
    """SFTConfig for rows of the sft export; the tokenised columns are built by the trainer itself."""

    think_weight: float | None = None  # re-weight assistant <think> segments; None keeps the rows' weights
    end_token: str | None = None  # the end-of-turn token trained after each assistant turn (default: eos)

    def __post_init__(self) -> None:
        self.dataset_kwargs = {**(self.dataset_kwargs or {}), "skip_prepare_dataset": True}
        self.remove_unused_columns = False
        super().__post_init__()


def reweight_think(messages: list[dict[str, Any]], think_weight: float) -> list[dict[str, Any]]:
    """The messages with every trained assistant turn's segments made anew (`export.segments`): its thinking
    at `think_weight`, the rest at 1.0; rows exported before the tags were split out are split too."""
    return [m | {"segments": segments(m["content"], think_weight)} if m["role"] == "assistant" and m.get("weight")
            else m for m in messages]


def tokenize_row(tokenizer: Any, messages: list[dict[str, Any]], max_length: int | None = None,
                 think_weight: float | None = None, end_token: str | None = None) -> dict[str, list]:
    """{input_ids, labels, loss_weights} of one chat without its repairs, cut to `max_length` tokens."""
    messages = clean_messages(messages)
    if think_weight is not None:
        messages = reweight_think(messages, think_weight)
    ids, weights = tokenize_with_weights(tokenizer, messages, end_token)
    ids, weights = ids[:max_length], weights[:max_length]
    return {"input_ids": ids, "labels": [i if w > 0 else IGNORE for i, w in zip(ids, weights)],
            "loss_weights": weights}


class WeightedCollator:
    """Right-pads input_ids (pad token), labels (-100) and loss_weights (0) and adds the attention mask."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        length = max(len(e["input_ids"]) for e in examples)

        def pad(key: str, value: float, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([list(e[key]) + [value] * (length - len(e[key])) for e in examples], dtype=dtype)

        return {"input_ids": pad("input_ids", self.pad_token_id, torch.long),
                "attention_mask": torch.tensor([[1] * len(e["input_ids"]) + [0] * (length - len(e["input_ids"]))
                                                for e in examples], dtype=torch.long),
                "labels": pad("labels", IGNORE, torch.long),
                "loss_weights": pad("loss_weights", 0.0, torch.float32)}


class WeightedSFTTrainer(SFTTrainer):
    """SFTTrainer over sft-export rows (a `datasets.Dataset` with a `messages` column) with the weighted loss."""

    def __init__(self, model: Any, args: WeightedSFTConfig, train_dataset: Any, processing_class: Any,
                 eval_dataset: Any = None, **kwargs: Any) -> None:
        def prepare(dataset: Any) -> Any:
            if dataset is None or "input_ids" in dataset.column_names:
                return dataset
            return dataset.map(lambda row: tokenize_row(processing_class, row["messages"], args.max_length,
                                                        args.think_weight, args.end_token),
                               remove_columns=dataset.column_names)

        super().__init__(model=model, args=args, train_dataset=prepare(train_dataset),
                         eval_dataset=prepare(eval_dataset), processing_class=processing_class,
                         data_collator=kwargs.pop("data_collator", None) or WeightedCollator(
                             processing_class.pad_token_id), **kwargs)

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        mode = "train" if self.model.training else "eval"
        inputs = dict(inputs)
        weights = inputs.pop("loss_weights")[:, 1:]
        outputs = model(**inputs, use_cache=False, fused_lm_head=True)  # SFTTrainer's chunked LM head
        num_tokens = outputs.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
        log_probs = outputs.log_probs
        count = torch.as_tensor(num_tokens, device=log_probs.device).clamp(min=1)
        loss = (-log_probs * weights.to(log_probs)).sum() / count
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())  # as SFTTrainer: DDP averages
        num_valid = outputs.label_mask.sum()
        correct = outputs.is_top1.sum()
        self._metrics[mode]["mean_token_accuracy"].append((correct / num_valid).item() if num_valid > 0 else 0.0)
        self._metrics[mode]["weighted_tokens"].append((weights * outputs.label_mask).sum().item())
        if return_outputs:
            with torch.no_grad():
                outputs = model(**{k: v for k, v in inputs.items() if k != "labels"})
            return loss, outputs
        return loss
