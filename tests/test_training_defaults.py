"""Training defaults a GPU run relies on, checked on the CPU: activation checkpointing on CUDA, float32 master
weights for full fine-tuning."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from mhqa_graph.training import configs, devices, policy  # noqa: E402

from mhqa_graph.errors import InvalidInput  # noqa: E402


def on(monkeypatch, kind: str, bf16: bool) -> None:
    monkeypatch.setattr(devices, "policy_device", lambda: torch.device(kind))
    monkeypatch.setattr(devices, "bf16_supported", lambda device: bf16 and device.type == "cuda")


def test_checkpointing_is_on_by_default_on_cuda_only(monkeypatch):
    on(monkeypatch, "cuda", bf16=True)
    args = devices.precision_args({})
    assert args["activation_checkpointing"] is True and args["bf16"] is True and args["use_cpu"] is False
    assert args["activation_checkpointing_kwargs"] == {"use_reentrant": False}
    assert "activation_checkpointing" not in devices.precision_args({"gradient_checkpointing": False})
    on(monkeypatch, "cpu", bf16=False)
    assert "activation_checkpointing" not in devices.precision_args({})


def test_full_fine_tuning_keeps_float32_masters_or_refuses_a_half_dtype():
    lora = configs.ModelConfig(name="tiny", lora=True, dtype="auto")
    assert policy.master_dtype(lora, torch.bfloat16) == torch.bfloat16  # the adapter trains in float32 anyway
    full = configs.ModelConfig(name="tiny", lora=False, dtype="auto")
    assert policy.master_dtype(full, torch.bfloat16) == torch.float32
    assert policy.master_dtype(configs.ModelConfig(name="tiny", lora=False, dtype="float32"), torch.float32) \
        == torch.float32
    with pytest.raises(InvalidInput, match="model.dtype bfloat16 with lora: false"):
        policy.master_dtype(configs.ModelConfig(name="tiny", lora=False, dtype="bfloat16"), torch.bfloat16)


def test_held_back_questions_take_their_paraphrases_with_them():
    """Questions of one gold path are held back together: a paraphrase of a held-back question never trains."""
    from mhqa_graph.training.mapgrpo import split_heldout

    path = [{"question": "a", "answer": "b", "triples": [["x", "r", "b"]]}]
    records = [{"id": "q1", "chain": [{"question": "q", "answer": "z", "triples": [["y", "s", "z"]]}]},
               {"id": "q2", "chain": path}, {"id": "q3", "chain": [{"question": "c", "answer": "d"}]},
               {"id": "q4", "chain": path}]  # q2 and q4: one path in two paraphrases
    rows = [{"id": r["id"], "prompt": r["id"]} for r in records]
    train, held = split_heldout(rows, records, 1)
    assert [r["id"] for r in held] == ["q2", "q4"] and [r["id"] for r in train] == ["q1", "q3"]


def test_gpu_check_reports_seconds_per_step_and_peak_memory():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    assert check._steps({"steps": {"1": 1, "2": 1}, "records": 2}) == 2
    assert check._steps({"roles": {"plan": {"steps": 1, "plan_executions": 2}, "analysis": {"steps": 3}}}) == 4
    out = check.measured(lambda: {"steps": {"1": 2}}, check._steps)
    assert out["steps"] == {"1": 2} and out["seconds_per_step"] >= 0 and out["peak_memory_gib"] > 0
    assert out["peak_memory_of"] == ("gpu" if torch.cuda.is_available() else "process")
