"""GRPO on episodes sampled under a reply grammar, scored under the distribution they were sampled from.

At each step of a constrained reply the grammar's logits processor leaves some tokens allowed and rules the others
out (-inf) before the sampling warpers, so the policy samples from its own distribution renormalised over the allowed
tokens. `GrammarSteps` records, per step, whether the grammar left one token (forced: env_mask 0, no gradient) or
several but not all (partly constrained: the allowed set, bit-packed). `GrammarGRPOTrainer` scores each partly
constrained token as it was sampled: the policy's logits at the trainer's temperature with the tokens the grammar
ruled out at that step masked, then log-softmax (`grammar_logps`). A token sampled without a grammar, which left
every token allowed, is scored by TRL as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from trl import GRPOTrainer

from mhqa_graph.errors import TrainingError

Allowed = dict[int, np.ndarray]  # an episode's partly constrained steps: completion position -> packed allowed set


class GrammarSteps:
    """A logits processor placed after the reply grammar's: per generated step, whether the grammar left one token
    (`forced`) and, where it left several but not all, the allowed set (`allowed`, `np.packbits` of the vocabulary
    mask; None elsewhere). The policy did not choose a forced token; it chose a partly constrained one among the
    allowed tokens only."""

    def __init__(self) -> None:
        self.forced: list[bool] = []
        self.allowed: list[np.ndarray | None] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        allowed = scores[0] > float("-inf")
        n = int(allowed.sum())
        self.forced.append(n == 1)
        self.allowed.append(np.packbits(allowed.cpu().numpy()) if 1 < n < allowed.numel() else None)
        return scores

    def forced_at(self, step: int) -> bool:
        return step < len(self.forced) and self.forced[step]

    def allowed_at(self, step: int) -> np.ndarray | None:
        return self.allowed[step] if step < len(self.allowed) else None


def allowed_mask(rows: list[Allowed], shape: tuple[int, int, int], device: torch.device) -> torch.Tensor:
    """The (rows, positions, vocabulary) boolean mask of the tokens each step left allowed: a recorded step's set,
    every token elsewhere."""
    mask = torch.ones(shape, dtype=torch.bool, device=device)
    for r, steps in enumerate(rows):
        if steps:
            positions = sorted(steps)
            bits = np.unpackbits(np.stack([steps[p] for p in positions]), axis=1, count=shape[-1]).astype(bool)
            mask[r, torch.tensor(positions, device=device)] = torch.from_numpy(bits).to(device)
    return mask


def grammar_logps(logits: torch.Tensor, ids: torch.Tensor, allowed: torch.Tensor,
                  temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of `ids` (B, T) and the entropies of the distributions they were sampled from: `logits`
    (B, T, V) at `temperature`, the tokens `allowed` (B, T, V) rules out masked, then log-softmax. TrainingError
    when a token is one its step ruled out (the record and the completion disagree)."""
    if not allowed.gather(-1, ids.unsqueeze(-1)).all():
        raise TrainingError("a completion token is one its reply grammar ruled out: the episode's record of the "
                            "grammar's steps does not match its tokens")
    logps = torch.log_softmax((logits.float() / temperature).masked_fill_(~allowed, float("-inf")), dim=-1)
    with torch.no_grad():
        entropies = torch.special.entr(logps.exp()).sum(-1)
    return logps.gather(-1, ids.unsqueeze(-1)).squeeze(-1), entropies


class GrammarGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer whose `rollout_func` also returns `grammar_allowed` (per episode, its `Allowed`). The sets
    go with the batch they belong to, and every scoring of a batch that has any (the loss, and the old and reference
    log-probabilities where TRL computes them) takes `grammar_logps` on the model's full logits instead of TRL's
    fused head. Overrides TRL's private `_generate`, `_generate_and_score_completions`, `_compute_loss` and
    `_get_per_token_logps_and_entropies` (pinned in tests/test_trl_contract.py)."""

    _grammar_rows: list[Allowed] | None = None  # the sets of the batch being scored, row by row

    def _generate(self, prompts: list) -> tuple:
        out = super()._generate(prompts)
        self._grammar_rows = out[5].pop("grammar_allowed", None)  # extra_fields: kept from the reward functions
        return out

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            output = super()._generate_and_score_completions(inputs)
            output["grammar_allowed"] = self._grammar_rows or [{} for _ in range(len(output["completion_ids"]))]
        finally:
            self._grammar_rows = None
        return output

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        self._grammar_rows = inputs.get("grammar_allowed")
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._grammar_rows = None

    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                           logits_to_keep: int, batch_size: int | None = None,
                                           compute_entropy: bool = False, **kwargs: Any) -> tuple:
        rows = self._grammar_rows
        if not rows or not any(rows):
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              batch_size, compute_entropy, **kwargs)
        if kwargs.get("compute_aux_loss"):
            raise TrainingError("grammar-constrained episodes are scored on the model's logits, which give no MoE "
                                "auxiliary loss")
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = start + batch_size
            with self.accelerator.autocast():
                logits = model(input_ids=input_ids[start:end], attention_mask=attention_mask[start:end],
                               logits_to_keep=logits_to_keep + 1, use_cache=False).logits[:, :-1]
            allowed = allowed_mask(rows[start:end], tuple(logits.shape), logits.device)
            lp, ent = grammar_logps(logits, input_ids[start:end, -logits_to_keep:], allowed, self.temperature)
            logps.append(lp)
            entropies.append(ent)
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None
