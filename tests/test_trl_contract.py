"""What the trainers rely on in TRL beyond its public API, pinned so that an upgrade fails here, loudly, and
not in the middle of a run: ExpertGRPOTrainer overrides `_generate` and `_generate_and_score_completions`
(training/mapgrpo.py), Omne's stage 1 passes episodes through `rollout_func` with `env_mask` (training/omne.py), and
GrammarGRPOTrainer overrides `_generate`, `_generate_and_score_completions`, `_compute_loss` and
`_get_per_token_logps_and_entropies` (training/grammar_scoring.py)."""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_installed_trl_is_the_pinned_one():
    extras = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    pinned = next(d for d in extras["train"] if d.startswith("trl=="))
    assert trl.__version__ == pinned.removeprefix("trl=="), "a TRL upgrade: check the contract below, then re-pin"


def test_generate_returns_what_the_expert_injection_edits():
    """`_generate(prompts)` returns (prompt_ids, completion_ids, tool_mask, completions, logprobs, ...): the
    expert sample replaces items 1, 3 and 4 of one group member."""
    assert list(inspect.signature(GRPOTrainer._generate).parameters) == ["self", "prompts"]
    returned = re.findall(r"return (prompt_ids, .*)", inspect.getsource(GRPOTrainer._generate))
    assert returned and [p.strip() for p in returned[-1].split(",")][:5] == [
        "prompt_ids", "completion_ids", "tool_mask", "completions", "logprobs"]


def test_scoring_gives_the_mask_and_count_the_expert_gradient_setting_edits():
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert list(inspect.signature(GRPOTrainer._generate_and_score_completions).parameters) == ["self", "inputs"]
    for key in ('"completion_mask"', '"num_items_in_batch"'):
        assert key in source, key


def test_rollout_func_and_env_mask_are_there_for_omne():
    assert "rollout_func" in inspect.signature(GRPOTrainer.__init__).parameters
    assert "env_mask" in inspect.getsource(GRPOTrainer)
    fields = GRPOConfig.__dataclass_fields__
    for name in ("num_generations", "num_generations_eval", "beta", "generation_batch_size", "max_completion_length",
                 "use_vllm", "vllm_mode"):
        assert name in fields, name


def test_the_scoring_the_grammar_trainer_overrides():
    """`_generate` hands back the rollout's extra fields as item 5 (where `grammar_allowed` is taken from); every
    log-probability of a batch, the loss's and the old and reference ones, comes from
    `_get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, batch_size,
    compute_entropy, ...)` at `self.temperature`, and `_compute_loss(model, inputs)` gets the batch's fields."""
    returned = re.findall(r"return (prompt_ids, .*)", inspect.getsource(GRPOTrainer._generate))
    assert [p.strip() for p in returned[-1].split(",")][5] == "extra_fields"
    assert list(inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters)[:7] == [
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy"]
    assert list(inspect.signature(GRPOTrainer._compute_loss).parameters) == ["self", "model", "inputs"]
    for method in (GRPOTrainer._generate_and_score_completions, GRPOTrainer._compute_loss):
        assert "self._get_per_token_logps_and_entropies(" in inspect.getsource(method)
    assert "self.temperature = args.temperature" in inspect.getsource(GRPOTrainer.__init__)
