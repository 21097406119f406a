"""MyGO end to end on a tiny random Qwen2: rollouts through the real graphs, rising τ, SFT on what is kept,
only trajectories that consulted workers when asked, a checkpoint per iteration and resumption; every
example config's training and dev slices are disjoint."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

from mhqa_graph.training import TRAINERS  # noqa: E402
from mhqa_graph.training.configs import DevConfig, load_config  # noqa: E402
from mhqa_graph.training.dev import check_disjoint  # noqa: E402
from mhqa_graph.training.mygo import MyGOConfig, MyGOTrainer, kept, sft_rows, worker_rounds  # noqa: E402
from mhqa_graph.training.rollouts import teacher_folder  # noqa: E402
from test_eval import scripted, write_dataset  # noqa: E402

from mhqa_graph.errors import InvalidInput  # noqa: E402
from mhqa_graph.eval import run_eval  # noqa: E402
from mhqa_graph.paths import file_sha256  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "train" / "mygo.yaml"
# yes/no questions: a warm-up on "yes" teaches even a tiny random model answers that score
YES = {"y1": ("Are Alpha and Beta both rock bands?", "yes", "comparison", "<answer>yes</answer>"),
       "y2": ("Is Gamma older than Delta?", "yes", "comparison", "<answer>yes</answer>"),
       "y3": ("Was Epsilon founded before Zeta?", "no", "comparison", "<answer>yes</answer>")}


def tiny_config(tmp_path: Path, **overrides) -> MyGOConfig:
    config = load_config(MyGOConfig, CONFIG)
    config.model.name, config.model.lora = "tiny", overrides.pop("lora", True)
    config.rollout.agent, config.rollout.dataset = overrides.pop("agent", "rag"), "hotpotqa"
    config.rollout.path = str(write_dataset(tmp_path / "tiny.jsonl", YES))
    config.rollout.store = f"embedded://{tmp_path}/s?embedder=hash"
    config.rollout.limit, config.rollout.samples, config.rollout.max_new_tokens = 3, 2, 12
    config.rollout.start, config.dev = 0, DevConfig()
    config.rollout.temperature = 0.0  # the warmed-up tiny model is right only at its mode
    config.output_dir = str(tmp_path / "out")
    config.sft = {"learning_rate": 1e-2, "gradient_accumulation_steps": 1, "max_length": 512}
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def record(rid: str, f1: float, sample: int = 0, failed: bool = False) -> dict:
    return {"id": rid, "f1": f1, "em": float(f1 == 1.0), "sample": sample, "failed": failed}


def test_kept_needs_a_positive_reward_at_least_tau():
    records = [record("a", 1.0), record("b", 0.4), record("c", 0.0), record("d", 0.9, failed=True)]
    assert [r["id"] for r in kept(records, 0.0)] == ["a", "b"]
    assert [r["id"] for r in kept(records, 0.5)] == ["a"]
    assert [r["id"] for r in kept(records, 0.5, reward="em")] == ["a"]


def mujica_record(rid: str, roles: list[str], f1: float = 1.0) -> dict:
    return record(rid, f1) | {"trace": {"llm_calls": [{"role": r} for r in roles]}}


def test_only_trajectories_that_consulted_workers_are_kept_when_asked():
    alone = mujica_record("a", ["planner"])  # the planner answered directly
    once = mujica_record("b", ["planner", "worker", "worker", "planner"])
    twice = mujica_record("c", ["planner", "worker", "planner", "worker", "worker", "planner"])
    assert [worker_rounds(r) for r in (alone, once, twice)] == [0, 1, 2]
    assert [r["id"] for r in kept([alone, once, twice], 0.5)] == ["a", "b", "c"]
    assert [r["id"] for r in kept([alone, once, twice], 0.5, min_worker_rounds=1)] == ["b", "c"]
    assert [r["id"] for r in kept([alone, once, twice], 0.5, min_worker_rounds=2)] == ["c"]


EXAMPLES = sorted(CONFIG.parent.rglob("*.yaml"))  # configs/train/<method>.yaml and learn/<method>-<run>.yaml


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_configs_train_and_evaluate_on_disjoint_slices(path, data_dir, tmp_path):
    import importlib

    module, config_cls, _ = TRAINERS[path.stem.split("-")[0]]
    cls = getattr(importlib.import_module(f"mhqa_graph.training.{module}"), config_cls)
    config = load_config(cls, path)
    assert config.dev.path and config.dev.start == 0  # the usual eval slice
    assert config.dev.limit >= config.dev.min_questions >= 100  # an interval on ΔF1 that says something
    root = CONFIG.parents[2]  # paths in the configs are relative to the repository root
    rollout = dataclasses.replace(config.rollout, path=str(root / config.rollout.path))
    dev = dataclasses.replace(config.dev, path=str(root / config.dev.path))
    assert "../shared/data" in config.rollout.path and Path(rollout.path).resolve().is_relative_to(data_dir.resolve())
    check_disjoint(rollout, dev)
    with pytest.raises(InvalidInput, match="share"):  # the check bites: training on the dev slice itself
        check_disjoint(dataclasses.replace(rollout, path=dev.path, start=dev.start), dev)


LEARNING = sorted((CONFIG.parent / "learn").glob("*.yaml"))


@pytest.mark.skipif(shutil.which("git") is None or not (CONFIG.parents[2] / ".git").exists(),
                    reason="not a git checkout")
@pytest.mark.parametrize("path", LEARNING, ids=[p.stem for p in LEARNING])
def test_a_learning_runs_records_can_be_committed(path):
    """Every learning config publishes its records under docs/runs/<its name>, a folder git does not ignore
    (as `runs/`, the machine's own run folders, is)."""
    import importlib
    import subprocess

    module, config_cls, _ = TRAINERS[path.stem.split("-")[0]]
    config = load_config(getattr(importlib.import_module(f"mhqa_graph.training.{module}"), config_cls), path)
    assert config.dev.records == f"docs/runs/{path.stem}"
    root = CONFIG.parents[2]
    for name, ignored in ((f"{config.dev.records}/untrained.jsonl.gz", False),
                          (f"{config.output_dir}/log.jsonl", True)):
        found = subprocess.run(["git", "check-ignore", "-q", name], cwd=root).returncode == 0
        assert found == ignored, f"{name} is {'' if found else 'not '}ignored by git"


DEV = {"d1": ("Is Eta a river?", "yes", "comparison", ""), "d2": ("Is Theta older than Iota?", "no", "comparison", "")}


def test_each_iteration_is_saved_and_a_rerun_resumes_after_the_last(tmp_path):
    import torch

    config = tiny_config(tmp_path, iterations=1)
    config.dev = DevConfig(path=str(write_dataset(tmp_path / "dev.jsonl", DEV)), min_questions=2)
    first = MyGOTrainer(config)
    first.train()
    assert (Path(config.output_dir) / "iter1" / "checkpoint" / "adapter_model.safetensors").is_file()
    with torch.no_grad():  # stand-in for trained weights, saved as iteration 1's
        for name, p in first.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
    first.tau = 0.7
    first.save(1)
    config.iterations = 2
    config.dev.guards_off = True
    second = MyGOTrainer(config)
    assert second.resume() == 1 and second.tau == 0.7
    trained = dict(first.model.named_parameters())
    assert all(torch.equal(p, trained[n]) for n, p in second.model.named_parameters())
    summary = MyGOTrainer(config).train()  # resumes again from iteration 1: only iteration 2 runs
    assert [r["iteration"] for r in summary["iterations"]] == [2] and summary["tau"] >= 0.7
    log = [json.loads(line) for line in (Path(config.output_dir) / "log.jsonl").read_text().splitlines()]
    assert {"event": "resumed", "after_iteration": 1, "tau": 0.7} in log
    untrained = [e for e in log if e.get("after") == "untrained"]  # the first training's: the rerun resumed
    assert len(untrained) == 1 and not untrained[0]["dev_reused"] and untrained[0]["dev_questions"] == 2
    assert summary["dev_untrained"]["dev_reused"]  # the rerun read the untrained run back from the cache
    assert Path(summary["dev_untrained"]["dev_run"]).parent == tmp_path / "untrained"
    for row in [e for e in log if "iteration" in e]:  # each iteration's dev line against the untrained run
        assert row["dev_paired"] == 2 and row["dev_better"] + row["dev_worse"] <= 2 and 0 < row["dev_sign_p"] <= 1
    assert json.loads((Path(config.output_dir) / "iter2" / "checkpoint" / "state.json").read_text())["iteration"] == 2
    guards_off = [e for e in log if e.get("after") == "final_guards_none"]  # the seeds' claim, after the last
    assert len(guards_off) == 1 and guards_off[0]["dev_paired"] == 2 and guards_off[0]["dev_guarded"] == 0
    assert summary["dev_guards_none"]["dev_questions"] == 2 and "dev_carried" not in guards_off[0]  # all asked
    untrained_off = [e for e in log if e.get("after") == "untrained_guards_none"]  # made before resuming, logged once
    assert len(untrained_off) == 1 and summary["dev_untrained_guards_none"]["dev_questions"] == 2


def test_a_run_stopped_in_a_dev_run_makes_it_when_resumed(tmp_path, stop_at):
    """Stopped after iteration 1's checkpoint, in its dev run: the rerun makes the dev run and logs the
    iteration's line, with the metrics saved beside the checkpoint, without rolling out or training again."""
    config = tiny_config(tmp_path, iterations=1)
    config.dev = DevConfig(path=str(write_dataset(tmp_path / "dev.jsonl", DEV)), min_questions=2)
    first = MyGOTrainer(config)
    stop_at(first, "dev", "iter1")
    with pytest.raises(KeyboardInterrupt):
        first.train()
    log_path = Path(config.output_dir) / "log.jsonl"
    stopped_log = [json.loads(line) for line in log_path.read_text().splitlines()]
    steps = [e for e in stopped_log if e.get("phase") == "iter1"]
    assert not [e for e in stopped_log if "iteration" in e]

    summary = MyGOTrainer(config).train()
    log = [json.loads(line) for line in log_path.read_text().splitlines()]
    rows = [e for e in log if "iteration" in e]
    assert [r["iteration"] for r in rows] == [r["iteration"] for r in summary["iterations"]] == [1]
    assert rows[0]["trajectories"] == 6 and rows[0]["tau"] == first.tau and rows[0]["dev_questions"] == 2
    assert [e for e in log if e.get("phase") == "iter1"] == steps  # not trained again


def test_a_run_stopped_on_one_machine_resumes_on_another_from_its_committed_checkpoint(tmp_path, stop_at):
    """Each saved iteration is published with the run's records (adapter, state, log; the newest only). A machine
    with none of the run's folders resumes from it: iteration 1 is neither rolled out nor trained again."""
    import torch

    config = tiny_config(tmp_path, iterations=1)
    records = tmp_path / "docs" / "runs" / "tiny"
    config.dev = DevConfig(path=str(write_dataset(tmp_path / "dev.jsonl", DEV)), min_questions=2,
                           records=str(records))
    first = MyGOTrainer(config)
    stop_at(first, "dev", "iter1")
    with pytest.raises(KeyboardInterrupt):
        first.train()
    published = records / "checkpoint" / "iter1"
    assert sorted(p.name for p in (records / "checkpoint").iterdir()) == ["iter1"]
    assert json.loads((published / "state.json").read_text())["iteration"] == 1
    assert (published / "adapter_model.safetensors").is_file() and (records / "log.jsonl").is_file()
    assert not (published / "README.md").exists()  # PEFT's blank model card is not committed
    trained = {n: p.detach().clone() for n, p in first.model.named_parameters()}
    stopped_log = (Path(config.output_dir) / "log.jsonl").read_text()
    shutil.rmtree(config.output_dir)  # another machine: only the committed files

    second = MyGOTrainer(config)
    assert second.resume() == 1
    assert all(torch.equal(p, trained[n]) for n, p in second.model.named_parameters())
    summary = MyGOTrainer(config).train()
    assert [r["iteration"] for r in summary["iterations"]] == [1]  # its dev run only
    log = [json.loads(line) for line in (Path(config.output_dir) / "log.jsonl").read_text().splitlines()]
    assert [e for e in log if e.get("event") == "restored"][0]["checkpoint"].endswith("iter1")
    assert (Path(config.output_dir) / "log.jsonl").read_text().startswith(stopped_log)  # the first machine's log
    assert not (Path(config.output_dir) / "iter1" / "rollouts").exists()  # not rolled out again
    rows = [e for e in log if "iteration" in e]
    assert [r["iteration"] for r in rows] == [1] and rows[0]["trajectories"] == 6 and rows[0]["dev_questions"] == 2
    assert not (records / "adapter" / "README.md").exists() and (records / "adapter").is_dir()


@pytest.mark.parametrize("same_weights", [True, False])
def test_an_iterations_rollouts_are_committed_and_read_back_by_a_run_from_the_same_weights(tmp_path, monkeypatch,
                                                                                          same_weights):
    """Stopped in iteration 1's SFT: its rollouts were published with the run's records, with the weights they
    were sampled from, and a machine with none of the run's folders reads them back instead of sampling again;
    rollouts of other weights are sampled anew."""
    import mhqa_graph.training.mygo as mygo

    config = tiny_config(tmp_path, iterations=1)
    records = tmp_path / "docs" / "runs" / "tiny"
    config.dev = DevConfig(path=str(write_dataset(tmp_path / "dev.jsonl", DEV)), min_questions=2,
                           records=str(records))
    warm = tmp_path / "warm"  # a warm-up on "yes", so that iteration 1 keeps trajectories to train on
    run_eval("rag", "hotpotqa", config.rollout.path, None, config.rollout.store, warm,
             context_overrides={"llm": scripted(YES)}, progress=False)
    config.warmup_run, config.sft["num_train_epochs"] = str(warm), 20
    logging = mygo.jsonl_log

    def stopping_log(path, **tags):  # iteration 1's SFT stops before its first step
        log = logging(path, **tags)
        if tags.get("phase") == "iter1":
            log.on_step_begin = lambda *args, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt)
        return log

    monkeypatch.setattr(mygo, "jsonl_log", stopping_log)
    with pytest.raises(KeyboardInterrupt):
        MyGOTrainer(config).train()
    published = records / "iter1_rollouts"
    made_with = json.loads((published / "made_with.json").read_text())
    saved = records / "checkpoint" / "iter0" / "adapter_model.safetensors"  # the weights sampled from
    assert made_with["after_iteration"] == 0 and made_with["weights"] == {saved.name: file_sha256(saved)}
    first = [json.loads(line) for line in (Path(config.output_dir) / "iter1" / "rollouts" / "sample0" /
                                           "results.jsonl").read_text().splitlines()]
    shutil.rmtree(config.output_dir)  # another machine: only the committed files
    if not same_weights:
        (published / "made_with.json").write_text(json.dumps(made_with | {"weights": {"other": "weights"}}))
    monkeypatch.setattr(mygo, "jsonl_log", logging)
    summary = MyGOTrainer(config).train()
    again = [json.loads(line) for line in (Path(config.output_dir) / "iter1" / "rollouts" / "sample0" /
                                           "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in again] == [r["id"] for r in first] and len(first) == 3
    assert (again == first) == same_weights  # read back as made (latency included), or sampled anew
    assert summary["iterations"][0]["trajectories"] == 6


def test_a_restored_checkpoint_keeps_a_local_log_that_is_not_the_committed_ones_start(tmp_path):
    """A machine whose own log is not the start of the committed one keeps it, says so, and still restores the
    checkpoint; a stage it has is not copied over."""
    from mhqa_graph.training.checkpoints import restore_checkpoint

    records, out = tmp_path / "records", tmp_path / "out"
    (records / "checkpoint" / "iter1").mkdir(parents=True)
    (records / "checkpoint" / "iter1" / "state.json").write_text('{"iteration": 1}')
    (records / "log.jsonl").write_text('{"event": "dev", "after": "untrained"}\n')
    out.mkdir()
    (out / "log.jsonl").write_text('{"event": "other"}\n')
    with pytest.warns(UserWarning, match="not the start"):
        restore_checkpoint(str(records), out)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert log[0] == {"event": "other"} and [e["event"] for e in log[1:]] == ["log_kept", "restored"]
    assert json.loads((out / "iter1" / "checkpoint" / "state.json").read_text()) == {"iteration": 1}
    (records / "checkpoint" / "iter1" / "state.json").write_text('{"iteration": 1, "newer": true}')
    restore_checkpoint(str(records), out)  # this machine has iter1: left as it is
    assert json.loads((out / "iter1" / "checkpoint" / "state.json").read_text()) == {"iteration": 1}


def test_a_warmup_stopped_between_steps_resumes_at_its_last_step(tmp_path, stop_training):
    """A warm-up SFT stopped after step 2 of 3 leaves checkpoint-2; the rerun trains step 3 only."""
    import mhqa_graph.training.mygo as mygo

    config = tiny_config(tmp_path, iterations=1)
    warm = tmp_path / "warm"
    run_eval("rag", "hotpotqa", config.rollout.path, None, config.rollout.store, warm,
             context_overrides={"llm": scripted(YES)}, progress=False)
    config.warmup_run, config.sft["max_steps"] = str(warm), 3
    go_on = stop_training(mygo, 2)
    with pytest.raises(stop_training.error):
        MyGOTrainer(config).train()
    folder = Path(config.output_dir) / "warmup"
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == ["checkpoint-2"]
    go_on()
    MyGOTrainer(config).train()
    log = [json.loads(line) for line in (Path(config.output_dir) / "log.jsonl").read_text().splitlines()]
    assert [e["from"] for e in log if e.get("event") == "resumed" and "from" in e] == ["checkpoint-2"]
    steps = [e for e in log if e.get("phase") == "warmup" and "loss" in e]
    assert [e["step"] for e in steps] == [1, 2, 3]
    row = next(e for e in log if e.get("iteration") == 0)  # the stage's loss, not that of the step after the resume
    assert row["loss"] == pytest.approx(sum(e["loss"] for e in steps) / 3) and row["loss"] != steps[-1]["loss"]
    assert not list(folder.glob("checkpoint-*"))  # removed once the pass is done


def test_config_from_yaml_and_bad_configs(tmp_path):
    config = load_config(MyGOConfig, CONFIG)
    assert config.rollout.agent == "mujica" and config.model.lora and config.rollout.samples == 4
    bad = tmp_path / "bad.yaml"
    for text in ("iterations: 0", "reward: bleu", "tau_0: 2", "rollout: {samples: 0}", "nope: 1",
                 "model: {lora_rank: 4}", "[1, 2]"):
        bad.write_text(text)
        with pytest.raises(InvalidInput):
            load_config(MyGOConfig, bad)


@pytest.mark.parametrize("lora", [True, False])
def test_warmup_then_iterations_train_on_kept_trajectories(tmp_path, lora):
    """A warm-up on a scripted model's correct trajectories teaches the tiny model to answer, so its
    own rollouts score > 0, τ rises, and the kept ones are trained on."""
    config = tiny_config(tmp_path, lora=lora, iterations=2)
    warm = tmp_path / "warm"
    run_eval("rag", "hotpotqa", config.rollout.path, None, config.rollout.store, warm,
             context_overrides={"llm": scripted(YES)}, progress=False)
    config.warmup_run, config.warmup_min_reward = str(warm), 1.0
    config.sft["num_train_epochs"] = 20
    trainer = MyGOTrainer(config)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    summary = trainer.train()
    log = [json.loads(line) for line in (Path(config.output_dir) / "log.jsonl").read_text().splitlines()]
    steps, log = [r for r in log if "phase" in r], [r for r in log if "phase" not in r]  # SFT steps, iterations
    assert {r["phase"] for r in steps if "loss" in r} >= {"warmup", "iter1"}
    assert log[0]["iteration"] == 0 and log[0]["warmup_rows"] == 2  # y1 and y2 are the scripted correct ones
    iters = log[1:]
    assert [r["iteration"] for r in iters] == [1, 2] and all(r["trajectories"] == 6 for r in iters)
    assert iters[0]["tau"] <= iters[1]["tau"] == summary["tau"]
    assert any(r["mean_reward"] > 0 for r in iters)  # the warmed-up model answers some questions
    trained = [r for r in iters if r["kept"]]
    assert trained and all(r["loss"] is not None and r["sft_rows"] >= 1 for r in trained)
    for r in iters:
        assert r["kept_fraction"] == r["kept"] / r["trajectories"]
    changed = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not p.equal(before[n])]
    assert changed and (all("lora_" in n for n in changed) if lora else True)
    assert (Path(summary["final"]) / ("adapter_config.json" if lora else "config.json")).is_file()
    rollout = Path(config.output_dir) / "iter1" / "rollouts" / "sample1" / "results.jsonl"
    assert len(rollout.read_text().splitlines()) == 3


def test_rows_are_the_agents_own_turns(tmp_path):
    config = tiny_config(tmp_path)
    run_eval("rag", "hotpotqa", config.rollout.path, None, config.rollout.store, tmp_path / "warm",
             context_overrides={"llm": scripted(YES)}, progress=False)
    from mhqa_graph.export import read_records

    rows = sft_rows(kept(read_records(tmp_path / "warm"), 1.0))
    assert {r["id"] for r in rows} == {"y1", "y2"}
    for row in rows:
        trained = [(m["role"], s["weight"]) for m in row["messages"] for s in m.get("segments") or []
                   if s["weight"] > 0]
        assert trained and all(t == ("assistant", 1.0) for t in trained)


def test_cli_train_runs_a_yaml_config(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from mhqa_graph.cli import app

    config = tiny_config(tmp_path, iterations=1)
    path = tmp_path / "mygo.yaml"
    path.write_text(yaml.safe_dump({"iterations": 1, "model": {"name": "tiny"}, "sft": config.sft,
                                    "rollout": {k: getattr(config.rollout, k) for k in
                                                ("agent", "dataset", "path", "store", "limit", "samples",
                                                 "temperature", "max_new_tokens")}}))
    result = CliRunner().invoke(app, ["train", "mygo", "--config", str(path), "--out", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    assert summary["iterations"][0]["trajectories"] == 6 and summary["final"] == str(tmp_path / "cli" / "final")
    bad = CliRunner().invoke(app, ["train", "ppo", "--config", str(path)])
    assert bad.exit_code != 0 and "unknown training method" in str(bad.exception)


def test_a_warmup_teacher_rolls_out_the_training_questions_once(tmp_path):
    """`warmup_teacher` makes the warm-up data from its own rollouts of the training questions, in a folder of
    its own that a rerun reuses; a config may not name both a run and a teacher."""
    teacher = 'fake:["<answer>yes</answer>"]'
    config = tiny_config(tmp_path, warmup_teacher=teacher)
    trainer = MyGOTrainer(config)
    records = trainer.warmup_records()
    folder = Path(config.output_dir) / "warmup_rollouts" / teacher_folder(teacher, config.rollout, config.model.seed)
    assert len(records) == 6 and (folder / "sample1" / "results.jsonl").is_file()  # 3 questions x 2 samples
    assert sorted(r["id"] for r in kept(records, 1.0)) == ["y1", "y1", "y2", "y2"]  # y3's gold is "no"
    stamp = (folder / "sample0" / "results.jsonl").stat().st_mtime_ns
    assert len(trainer.warmup_records()) == 6 and (folder / "sample0" / "results.jsonl").stat().st_mtime_ns == stamp
    with pytest.raises(InvalidInput, match="not both"):
        tiny_config(tmp_path, warmup_teacher=teacher, warmup_run=str(folder)).__post_init__()


def test_a_teacher_samples_as_the_rollouts_do_with_a_seed_per_sample(tmp_path, monkeypatch):
    """The teacher answers at `rollout.temperature` (not its greedy default, which would make every sample the
    same), sample j's calls seeded from seed + j·SAMPLE_SEEDS, each sample's model made when it is rolled out;
    another temperature or seed is another folder."""
    from mhqa_graph.training.rollouts import SAMPLE_SEEDS

    import mhqa_graph.models.factory as factory
    from mhqa_graph.testing.fakes import FakeChatModel

    made = []

    def load(spec, **kwargs):
        made.append(kwargs)
        return FakeChatModel(responses=[f"<answer>{'yes' if len(made) == 1 else 'no'}</answer>"])

    monkeypatch.setattr(factory, "load_chat_model", load)
    teacher = "llamacpp:qwen2.5-coder-1.5b?slots=2"
    config = tiny_config(tmp_path, warmup_teacher=teacher, model=dataclasses.replace(tiny_config(tmp_path).model,
                                                                                     seed=7))
    config.rollout.temperature = 0.8
    records = MyGOTrainer(config).warmup_records()
    assert [(m["temperature"], m["seed"]) for m in made] == [(0.8, 7), (0.8, 7 + SAMPLE_SEEDS)]
    assert {r["prediction"] for r in records if r["sample"] == 0} == {"yes"}
    assert {r["prediction"] for r in records if r["sample"] == 1} == {"no"}  # the samples differ
    folder = teacher_folder(teacher, config.rollout, 7)
    assert folder != teacher_folder(teacher, config.rollout, 8)
    assert folder != teacher_folder(teacher, dataclasses.replace(config.rollout, temperature=0.7), 7)
    made.clear()
    config.rollout.temperature, config.output_dir = 0.0, str(tmp_path / "greedy")
    MyGOTrainer(config).warmup_records()
    assert [(m["temperature"], m["seed"]) for m in made] == [(0.0, None), (0.0, None)]  # greedy: unseeded


def test_a_teachers_rollouts_are_committed_and_read_back_on_another_machine(tmp_path, monkeypatch):
    """With a run's `dev.records`, a teacher's rollouts are published there in full (the SFT reads their traces);
    a run on another machine (no local folder, or one stopped earlier) reads them back and asks the teacher
    nothing more, not even loading it; records of another questions file are another run's, not read back."""
    from mhqa_graph.training.rollouts import teacher_rollouts

    import mhqa_graph.models.factory as factory
    from mhqa_graph.testing.fakes import FakeChatModel

    models = []

    def load(spec, **kwargs):
        models.append(FakeChatModel(responses=["<answer>yes</answer>"]))
        return models[-1]

    monkeypatch.setattr(factory, "load_chat_model", load)
    rollout, teacher, committed = tiny_config(tmp_path).rollout, "llamacpp:qwen2.5-coder-1.5b", tmp_path / "docs"
    made = teacher_rollouts(rollout, teacher, 0, tmp_path / "here", committed)
    shared = committed / teacher_folder(teacher, rollout, 0)
    assert sorted(p.name for p in shared.iterdir()) == ["made_with.json", "sample0.jsonl.gz", "sample0.run.json",
                                                       "sample1.jsonl.gz", "sample1.run.json"]
    assert json.loads((shared / "made_with.json").read_text()) == {"teacher": teacher, "temperature": 0.0}
    asked = sum(len(m.calls) for m in models)
    assert asked >= 6
    elsewhere = tmp_path / "elsewhere"  # another machine: sample 1 stopped after one question, sample 0 absent
    partial = elsewhere / shared.name / "sample1"
    partial.mkdir(parents=True)
    lines = (tmp_path / "here" / shared.name / "sample1" / "results.jsonl").read_text().splitlines()
    (partial / "results.jsonl").write_text(lines[0] + "\n")
    shutil.copyfile(tmp_path / "here" / shared.name / "sample1" / "run.json", partial / "run.json")
    loaded = len(models)
    again = teacher_rollouts(rollout, teacher, 0, elsewhere, committed)
    assert sum(len(m.calls) for m in models) == asked and len(models) == loaded  # not asked again, nor loaded
    key = lambda r: (r["sample"], r["id"], r["prediction"], len(r["trace"]["llm_calls"]))  # noqa: E731
    assert sorted(map(key, again)) == sorted(map(key, made))
    other = tmp_path / "other.jsonl"
    other.write_text(Path(rollout.path).read_text() + "\n")
    teacher_rollouts(dataclasses.replace(rollout, path=str(other)), teacher, 0, tmp_path / "third", committed)
    assert sum(len(m.calls) for m in models) >= 2 * asked  # asked afresh, and published over the others
    assert json.loads((shared / "sample0.run.json").read_text())["file"] == str(other.resolve())


# -- issue 65, section 5: committed checkpoints are not trusted -----------------------------------------------
@pytest.mark.parametrize("plant", ["weights", "stage folder", "log"])
def test_a_committed_checkpoint_holding_a_symlink_is_refused_and_nothing_is_copied(tmp_path, plant):
    """`restore_checkpoint` copied what committed symlinks point to (a file of the machine that restores it)."""
    from mhqa_graph.training.checkpoints import restore_checkpoint

    from mhqa_graph.errors import CheckpointError

    precious, records, out = tmp_path / "precious.txt", tmp_path / "records", tmp_path / "out"
    precious.write_text("keep", encoding="utf-8")
    stage = records / "checkpoint" / "iter1"
    if plant == "stage folder":
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "state.json").write_text('{"iteration": 1, "tau": 0.5}', encoding="utf-8")
        stage.parent.mkdir(parents=True)
        stage.symlink_to(outside)
    else:
        stage.mkdir(parents=True)
        (stage / "state.json").write_text('{"iteration": 1, "tau": 0.5}', encoding="utf-8")
        (stage / "adapter_model.safetensors" if plant == "weights" else records / "log.jsonl").symlink_to(precious)
    with pytest.raises(CheckpointError, match="is a symbolic link; a checkpoint's files are not followed out of it"):
        restore_checkpoint(str(records), out)
    assert not out.exists()


STATES = [("[]", "is not a checkpoint's state (a JSON list, not an object)"),
          ('{"iteration": 1, "tau"', "cannot be read"),
          ('{"iteration": "1", "tau": 0.5}', "iteration must be int, got '1'"),
          ('{"iteration": true, "tau": 0.5}', "iteration must be int, got True"),
          ('{"iteration": 1, "tau": "hot"}', "tau must be int or float, got 'hot'"),
          ('{"iteration": 1, "tau": NaN}', "tau must be int or float, got nan"),
          ('{"iteration": 1, "tau": 0.5, "row": [1]}', "row must be dict or null, got [1]")]


@pytest.mark.parametrize(("text", "message"), STATES, ids=[m.split(" ")[0] + str(i) for i, (_, m) in enumerate(STATES)])
def test_a_state_json_of_the_wrong_types_is_a_typed_error_before_any_weights_load(tmp_path, text, message):
    """MyGO's resume trusted state.json's types: a TypeError or AttributeError, or an iteration "1" resumed from."""
    from types import SimpleNamespace

    from mhqa_graph.errors import CheckpointError

    folder = tmp_path / "iter1" / "checkpoint"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(text, encoding="utf-8")
    trainer = object.__new__(MyGOTrainer)  # no model: the state is checked before any weights load
    trainer.config, trainer.out, trainer.model = SimpleNamespace(dev=SimpleNamespace(records=None)), tmp_path, None
    with pytest.raises(CheckpointError) as refused:
        trainer.resume()
    assert str(refused.value).startswith(f"{folder / 'state.json'}") and message in str(refused.value)


def test_the_committed_checkpoints_state_is_of_its_types():
    from mhqa_graph.training.checkpoints import read_state
    from mhqa_graph.training.mygo import STATE_TYPES

    path = Path(__file__).resolve().parents[1] / "docs" / "runs" / "mygo-warmup-pq2h" / "checkpoint" / "iter1"
    assert read_state(path / "state.json", STATE_TYPES)["iteration"] == 1
