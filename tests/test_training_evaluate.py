"""`training/evaluate.py`: a committed adapter measured on another dev slice, the untrained policy beside it, each
answered as the learning run's dev runs are, with records that `training/runs.py` tables (a tiny random policy
over a hash-embedder store)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("trl")
import torch  # noqa: E402
import yaml  # noqa: E402
from mhqa_graph.training import evaluate as ev  # noqa: E402
from mhqa_graph.training.configs import DevConfig, ModelConfig, load_config  # noqa: E402
from mhqa_graph.training.dev import UNTRAINED  # noqa: E402
from mhqa_graph.training.omne import OmneConfig  # noqa: E402
from mhqa_graph.training.policy import load_model  # noqa: E402
from mhqa_graph.training.runs import dev_runs  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from test_omne_training import YAML, wiki_row  # noqa: E402

from mhqa_graph.errors import DevSliceError, InvalidInput  # noqa: E402
from mhqa_graph.eval.records import SUFFIX, load  # noqa: E402
from mhqa_graph.models.adapters import WEIGHTS  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def run(tmp_path) -> tuple[Path, Path]:
    """An Omne learning run's config (questions 0-1 train, 2 is its dev slice, 3-4 another) and a trained adapter."""
    data = tmp_path / "dev_evidences.json"
    data.write_text(json.dumps([wiki_row(str(i)) for i in range(5)]))
    cfg = load_config(OmneConfig, YAML)
    rollout = dataclasses.replace(cfg.rollout, path=str(data), store=f"embedded://{tmp_path}/s?embedder=hash",
                                  start=0, limit=2, max_new_tokens=16, context={"max_rounds": 2})
    cfg = dataclasses.replace(cfg, model=ModelConfig(name="tiny", lora_r=4), rollout=rollout,
                              dev=DevConfig(path=str(data), start=2, limit=1, min_questions=1),
                              output_dir=str(tmp_path / "runs" / "learn" / "omne"))
    config = tmp_path / "omne.yaml"
    config.write_text(yaml.safe_dump(dataclasses.asdict(cfg)), encoding="utf-8")
    model, _ = load_model(cfg.model)
    torch.manual_seed(0)
    for name, weight in model.named_parameters():
        if "lora_B" in name:
            weight.data.normal_(0, 0.5)
    model.save_pretrained(tmp_path / "adapter")
    return config, tmp_path / "adapter"


def lora_b(model) -> float:
    return sum(float(w.detach().abs().sum()) for n, w in model.named_parameters() if "lora_B" in n)


def test_the_adapter_and_the_untrained_policy_answer_the_other_slice(run, tmp_path, monkeypatch):
    config, adapter = run
    seen = {}
    dev = ev.policy_dev

    def spy(rollout, dev_config, model, tokenizer, output_dir, name, model_config):
        seen[name] = (lora_b(model), dev_config.start, dev_config.limit)
        return dev(rollout, dev_config, model, tokenizer, output_dir, name, model_config)

    monkeypatch.setattr(ev, "policy_dev", spy)
    records = tmp_path / "docs" / "fresh"
    metrics = ev.evaluate("omne", config, adapter, start=3, limit=2, name="stage1", records=records)
    assert list(metrics) == [UNTRAINED, "stage1"] and "dev_df1" in metrics["stage1"]
    saved = sum(float(abs(w).sum()) for k, w in load_file(str(adapter / WEIGHTS)).items() if "lora_B" in k)
    assert seen[UNTRAINED] == (0.0, 3, 2) and seen["stage1"] == (pytest.approx(saved, rel=1e-5), 3, 2)
    for name in (UNTRAINED, "stage1"):
        assert [r["id"] for r in load(records / f"{name}{SUFFIX}")] == ["3", "4"]
    logged = [json.loads(line) for line in (records / "log.jsonl").read_text().splitlines()]
    assert [e.get("after") for e in logged if e["event"] == "dev"] == [UNTRAINED, "stage1"]
    assert list(dev_runs(records)) == [UNTRAINED, "stage1"]  # what `training/runs.py` tables
    again = ev.evaluate("omne", config, adapter, start=3, limit=2, name="stage1", records=records, only=UNTRAINED)
    assert list(again) == [UNTRAINED] and again[UNTRAINED]["dev_reused"]  # one of the two, read back


def test_a_bad_adapter_or_slice_is_refused(run, tmp_path):
    config, adapter = run
    records = tmp_path / "docs" / "fresh"
    with pytest.raises(DevSliceError, match="share"):  # the training questions are no fresh slice
        ev.evaluate("omne", config, adapter, start=0, limit=2, name="stage1", records=records)
    with pytest.raises(DevSliceError, match="share 1 with the run's own dev slice"):  # nor its own dev slice
        ev.evaluate("omne", config, adapter, start=2, limit=2, name="stage1", records=records)
    with pytest.raises(InvalidInput, match="one adapter: mygo or omne"):
        ev.evaluate("mapgrpo", config, adapter, start=3, limit=2, name="stage1", records=records)
    with pytest.raises(InvalidInput, match="no PEFT adapter"):
        ev.evaluate("omne", config, tmp_path, start=3, limit=2, name="stage1", records=records)
    with pytest.raises(InvalidInput, match="run without the adapter"):
        ev.evaluate("omne", config, adapter, start=3, limit=2, name=UNTRAINED, records=records)
    for other in (ModelConfig(name="tiny", lora_r=8), ModelConfig(name="tiny", lora_r=4, lora_alpha=8),
                  ModelConfig(name="tiny", lora_r=4, target_modules=["q_proj"])):
        model, _ = load_model(other)
        with pytest.raises(InvalidInput, match="holds an adapter of"):
            ev.load_adapter(model, adapter, other)
