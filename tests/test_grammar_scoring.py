"""`training/grammar_scoring.py` on tiny tensors: what a reply grammar's step left allowed is recorded, and a token
sampled under it is scored under the policy renormalised over those tokens (the grammar's distribution), at the
trainer's temperature."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from mhqa_graph.training.grammar_scoring import GrammarSteps, allowed_mask, grammar_logps  # noqa: E402

from mhqa_graph.errors import TrainingError  # noqa: E402

INF = float("-inf")


def test_a_partly_constrained_token_is_scored_under_the_renormalised_distribution():
    """Four tokens with probabilities 1/5, 1/5, 1/5, 2/5; the grammar allows tokens 0 and 3: token 3 was sampled with
    probability 2/3, not 2/5, and the forbidden tokens' logits get no gradient."""
    logits = torch.tensor([[[0.0, 0.0, 0.0, math.log(2)]]], requires_grad=True)
    ids = torch.tensor([[3]])
    allowed = torch.tensor([[[True, False, False, True]]])
    logps, entropies = grammar_logps(logits, ids, allowed)
    assert logps.item() == pytest.approx(math.log(2 / 3))
    assert entropies.item() == pytest.approx(-(1 / 3) * math.log(1 / 3) - (2 / 3) * math.log(2 / 3))
    logps.sum().backward()
    assert logits.grad[0, 0, 1] == 0 and logits.grad[0, 0, 2] == 0
    assert logits.grad[0, 0].tolist() == pytest.approx([-1 / 3, 0, 0, 1 / 3])  # onehot - p, over the allowed

    everything = torch.ones_like(allowed)  # no grammar: the policy's own distribution
    assert grammar_logps(logits, ids, everything)[0].item() == pytest.approx(math.log(2 / 5))
    hot = grammar_logps(logits, ids, allowed, temperature=2.0)[0].item()  # logits / 2: 1 against sqrt(2)
    assert hot == pytest.approx(math.log(math.sqrt(2) / (1 + math.sqrt(2))))


def test_a_token_its_step_ruled_out_is_an_error():
    with pytest.raises(TrainingError, match="ruled out"):
        grammar_logps(torch.zeros(1, 1, 4), torch.tensor([[1]]), torch.tensor([[[True, False, False, True]]]))


def test_the_steps_recorded_are_the_masks_scored():
    """Per step: one token left (forced: no set kept), several (the set, bit-packed), all (unconstrained: none);
    `allowed_mask` puts each kept set back at its completion position, every token allowed elsewhere."""
    steps = GrammarSteps()
    for row in ([INF, 0.5, INF, INF, INF], [0.1, INF, 0.3, INF, 0.2], [0.1, 0.2, 0.3, 0.4, 0.5]):
        scores = torch.tensor([row])
        assert steps(None, scores) is scores
    assert [steps.forced_at(i) for i in range(4)] == [True, False, False, False]
    assert [steps.allowed_at(i) is None for i in range(4)] == [True, False, True, True]
    rows = [{7: steps.allowed_at(1)}, {}]
    mask = allowed_mask(rows, (2, 9, 5), torch.device("cpu"))
    assert mask[0, 7].tolist() == [True, False, True, False, True]
    assert mask.sum().item() == 2 * 9 * 5 - 2 and np.packbits([1, 0, 1, 0, 1]).tolist() == rows[0][7].tolist()
