"""Every trainer of `mhqa train` loads its example config; bad methods and configs fail before any model loads."""

import importlib
from pathlib import Path

import pytest

pytest.importorskip("trl")

from mhqa_graph.training import TRAINERS, train  # noqa: E402
from mhqa_graph.training.configs import load_config  # noqa: E402

from mhqa_graph.errors import InvalidInput  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "train"


@pytest.mark.parametrize("method", sorted(TRAINERS))
def test_example_config_loads(method):
    module, config_cls, trainer_cls = TRAINERS[method]
    mod = importlib.import_module(f"mhqa_graph.training.{module}")
    config = load_config(getattr(mod, config_cls), CONFIGS / f"{method}.yaml")
    assert config.model.name == "qwen2.5-coder-0.5b" and config.model.lora
    assert hasattr(getattr(mod, trainer_cls), "train")


@pytest.mark.parametrize("method", sorted(TRAINERS))
def test_unknown_keys_fail_before_loading_a_model(method, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {name: tiny}\nlearning_rate: 0.1\n")
    with pytest.raises(InvalidInput, match="learning_rate"):
        train(method, bad)


def test_unknown_method(tmp_path):
    with pytest.raises(InvalidInput, match="ppo"):
        train("ppo", tmp_path / "x.yaml")
