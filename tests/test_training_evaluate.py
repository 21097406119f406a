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
from mhqa_graph.training.dev import UNTRAINED, check_disjoint  # noqa: E402
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


# PQ-2H.txt's lines 99-102 (ids PQ-2H-99 to -102) beside a training line: the dev slice of the shipped adapter ended at
# PQ-2H-100 and its fresh slice began at PQ-2H-101, a paraphrase of it, as is PQ-2H-102
SVANTE = "svante_nilsson#children#sten_sture_the_younger#gender#male#<end>#male"
PQ_LINES = ["who is alpha_beta 's father 's wife ?\tgamma(gamma/)\talpha_beta#father#delta#spouse#gamma#<end>#gamma",
            "svante_nilsson 's child 's nation ?\tsweden(sweden/)\t"
            "svante_nilsson#children#sten_sture_the_younger#nationality#sweden#<end>#sweden",
            f"what is the sex of svante_nilsson 's child ?\tmale(male/)\t{SVANTE}",
            f"what sex is svante_nilsson 's child  ?\tmale(male/)\t{SVANTE}",
            f"the sex of child of svante_nilsson ?\tmale(male/)\t{SVANTE}",
            "mary_de_bohun 's kid 's nationality ?\tengland(england/)\t"
            "mary_de_bohun#children#philippa_of_england#nationality#england#<end>#england"]


def test_a_fresh_slice_may_not_paraphrase_the_dev_slice(tmp_path, monkeypatch):
    """Questions of the dev slice's gold paths are not fresh, whatever their ids and texts: the fresh slice that
    starts with two paraphrases of the dev slice's last question is refused (and a training slice of them too), the
    one after them is not."""
    data = tmp_path / "PQ-2H.txt"
    data.write_text("\n".join(PQ_LINES) + "\n", encoding="utf-8")
    (tmp_path / "2H-kb.txt").write_text("".join(
        f"{a}\t{r}\t{b}\n" for line in PQ_LINES for a, r, b in [line.split("\t")[2].split("#")[i:i + 3]
                                                                 for i in (0, 2)]), encoding="utf-8")
    cfg = load_config(OmneConfig, YAML)
    rollout = dataclasses.replace(cfg.rollout, dataset="pathquestion", path=str(data), start=0, limit=1)
    cfg = dataclasses.replace(cfg, model=ModelConfig(name="tiny", lora_r=4), rollout=rollout,
                              dev=DevConfig(path=str(data), start=1, limit=2, min_questions=1),
                              output_dir=str(tmp_path / "omne"))
    config = tmp_path / "omne.yaml"
    config.write_text(yaml.safe_dump(dataclasses.asdict(cfg)), encoding="utf-8")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / WEIGHTS).write_bytes(b"")

    def checked(*args, **kwargs):
        raise RuntimeError("the slice passed its checks")

    monkeypatch.setattr(ev, "load_model", checked)
    with pytest.raises(DevSliceError, match="share 2 with the run's own dev slice .* gold path, e.g. 'PQ-2H-4'"):
        ev.evaluate("omne", config, adapter, start=3, limit=2, name="stage1", records=tmp_path / "fresh")
    with pytest.raises(RuntimeError, match="passed its checks"):
        ev.evaluate("omne", config, adapter, start=5, limit=1, name="stage1", records=tmp_path / "fresh")
    with pytest.raises(DevSliceError, match="share 1 question"):  # a training slice of a paraphrase
        check_disjoint(dataclasses.replace(rollout, start=4), cfg.dev)
