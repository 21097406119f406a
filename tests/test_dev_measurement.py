"""How trainers measure the dev slice: the paired bootstrap and sign test against the untrained policy, the
behaviour rates of a run, the untrained run kept in a cache keyed by what it depends on, and dev slices of
enough questions that share none with training."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from test_eval import write_dataset

from mhqa_graph.errors import DevSliceError, InvalidInput
from mhqa_graph.eval.health import behaviour, format_repairs
from mhqa_graph.eval.paired import detectable, paired_comparison, paired_interval, sign_test, verdict
from mhqa_graph.testing.fakes import FakeChatModel

configs = pytest.importorskip("mhqa_graph.training.configs")  # the train extra
dev_module = pytest.importorskip("mhqa_graph.training.dev")
logs = pytest.importorskip("mhqa_graph.training.logs")
policy = pytest.importorskip("mhqa_graph.training.policy")
DevConfig, ModelConfig, RolloutConfig = configs.DevConfig, configs.ModelConfig, configs.RolloutConfig


# -- the paired bootstrap and the sign test -------------------------------------------------------------
def test_sign_test_on_fixed_counts():
    assert sign_test(9, 6) == pytest.approx(0.6072, abs=1e-4)  # issue 27's MyGO run: p ≈ 0.6
    assert sign_test(10, 0) == pytest.approx(2 / 1024) and sign_test(0, 10) == sign_test(10, 0)
    assert sign_test(0, 0) == 1.0 and sign_test(5, 5) == 1.0
    assert sign_test(15, 3) < 0.01 < sign_test(12, 6)


def test_paired_interval_on_fixed_differences():
    assert paired_interval([0.25] * 10) == (25.0, 25.0) and paired_interval([1.0]) is None
    low, high = paired_interval([1.0, 0.0] * 20)  # mean 50 points on 40 questions
    assert 30 < low < 50 < high < 70
    assert paired_interval([1.0, 0.0] * 20) == (low, high)  # seeded: the same interval every time
    low, high = paired_interval([0.2] * 90 + [-0.1] * 10)  # every resample's mean lies in [-10, 20]
    assert 15 <= low < 17 < high <= 19


def test_paired_comparison_pairs_by_id_and_counts_better_and_worse():
    before = [{"id": i, "f1": f} for i, f in [("a", 0.0), ("b", 1.0), ("c", 0.5), ("d", 0.2), ("x", 1.0)]]
    after = [{"id": i, "f1": f} for i, f in [("a", 1.0), ("b", 1.0), ("c", 0.0), ("d", 1.0), ("y", 0.0)]]
    out = paired_comparison(before, after)  # x and y are not in both
    assert out["paired"] == 4 and out["better"] == 2 and out["worse"] == 1
    assert out["df1"] == pytest.approx(100 * (1.0 + 0.0 - 0.5 + 0.8) / 4)
    assert out["df1_low"] <= out["df1"] <= out["df1_high"] and out["sign_p"] == sign_test(2, 1)
    lone = paired_comparison(before[:1], after[:1])
    assert lone["paired"] == 1 and lone["df1_low"] is None and lone["df1_high"] is None


@pytest.mark.parametrize(("low", "high", "target", "said"), [
    (1.0, 9.0, 0.0, "met"), (-1.0, 9.0, 0.0, "within noise"), (-9.0, -1.0, 0.0, "missed"),
    (8.4, 25.3, 10.0, "within noise"), (10.5, 25.3, 10.0, "met"), (None, None, 0.0, None)])
def test_a_target_is_met_only_when_the_intervals_lower_bound_clears_it(low, high, target, said):
    assert verdict(low, high, target) == said


def test_the_detectable_difference_shrinks_with_more_clusters_and_a_comparison_says_its_verdict():
    few = detectable([1.0, 0.0, -1.0, 0.5] * 10)
    many = detectable([1.0, 0.0, -1.0, 0.5] * 40)
    assert many < few and abs(few / many - 2.0) < 0.3  # four times the questions: about half the effect
    clustered = detectable([1.0, 0.0, -1.0, 0.5] * 10, clusters=[str(i // 4) for i in range(40)])
    assert clustered is not None and detectable([1.0]) is None
    before = [{"id": str(i), "f1": 0.0} for i in range(40)]
    after = [{"id": str(i), "f1": 1.0 if i % 2 else 0.0} for i in range(40)]
    out = paired_comparison(before, after, target=10.0)
    assert out["verdict"] == "met" and out["target"] == 10.0 and out["detectable"] > 0
    assert paired_comparison(before, after, target=80.0)["verdict"] == "missed"


def test_the_bench_tables_use_the_same_interval(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))  # bench/'s modules import each other
    import tables

    assert tables.paired_interval is paired_interval and tables.format_repairs is format_repairs


# -- behaviour rates ------------------------------------------------------------------------------------
def call(role: str, user: str = "Question: ...") -> dict:
    return {"role": role, "messages": [{"role": "user", "content": user}], "output": "..."}


def tool(result: str = "Alpha (band): genre rock", repeated: bool = False) -> dict:
    return {"name": "node_info", "args": {}, "result_preview": result, "repeated": repeated}


def record(prediction: str, agent: str, calls: list[dict] = (), tools: list[dict] | None = None,
           malformed: bool = False) -> dict:
    design = {"tool_calls": tools} if tools is not None else {}
    return {"id": prediction or "empty", "prediction": prediction, "health": {"malformed": malformed},
            "trace": {"agent": agent, "llm_calls": list(calls), "design": design}}


def test_behaviour_rates_of_omne_records():
    from mhqa_graph.graphs.calls import REPAIR_PREFIX
    from mhqa_graph.graphs.omne.prompts import NUDGE, ONE_HOP_SHORT

    records = [
        record("Tulsa", "omne", [call("agent"), call("agent")], [tool(), tool(repeated=True)]),
        record("unknown", "omne", [call("agent"), call("agent", NUDGE)], [tool("Error: no entity")]),
        record("", "omne", [call("agent"), call("agent", REPAIR_PREFIX + " reply as asked")], [], malformed=True),
        record("The passages do not mention it", "omne",
               [call("agent"), call("agent", ONE_HOP_SHORT.format(entity="Alpha", relations="genre", facts="..."))],
               [tool(), tool()]),
    ]
    assert [format_repairs(r) for r in records] == [0, 1, 1, 0]  # a guard's send-back is no format fault
    rates = behaviour(records)
    assert rates["well_formed"] == 0.5 and rates["malformed"] == 1 and rates["repairs"] == 2
    assert rates["tool_rate"] == 0.75 and rates["acted_rate"] == 0.5 and rates["successful_calls"] == 3
    assert rates["unknown"] == 3  # "unknown", the empty answer, "... do not mention ..."
    assert rates["answer_chars"] == pytest.approx((5 + 7) / 2)  # median of 0, 5, 7, 29
    assert "worker_rate" not in rates


def test_behaviour_rates_of_mujica_records():
    from mhqa_graph.graphs.calls import REPAIR_PREFIX

    records = [record("Tulsa", "mujica", [call("planner"), call("worker"), call("worker"), call("planner")]),
               record("1817", "mujica", [call("planner"), call("worker"), call("worker", REPAIR_PREFIX + " JSON")]),
               record("no", "mujica", [call("planner")])]
    records[2]["health"]["guards"] = {"unecho": 1}
    rates = behaviour(records)
    assert rates["guarded"] == 1
    assert rates["worker_rate"] == pytest.approx(2 / 3) and rates["dispatches"] == 3  # the repair is no dispatch
    assert rates["well_formed"] == pytest.approx(2 / 3) and "tool_rate" not in rates
    assert behaviour([])["well_formed"] == 0.0


def test_dev_metrics_carry_the_rates_and_the_comparison():
    untrained = [record("x", "mujica", [call("planner")]) | {"id": str(i), "f1": 0.0, "em": 0.0} for i in range(5)]
    trained = [r | {"f1": 1.0 if i < 3 else 0.0} for i, r in enumerate(untrained)]
    metrics = dev_module.dev_metrics(trained, untrained)
    assert metrics["dev_f1"] == 0.6 and metrics["dev_questions"] == 5 and metrics["dev_worker_rate"] == 0.0
    assert metrics["dev_df1"] == pytest.approx(60.0) and (metrics["dev_better"], metrics["dev_worse"]) == (3, 0)
    assert metrics["dev_sign_p"] == sign_test(3, 0) and metrics["dev_paired"] == 5
    assert "dev_df1" not in dev_module.dev_metrics(trained)


# -- the untrained run's cache --------------------------------------------------------------------------
DEV = {f"d{i}": (f"Which city did band D{i} first play in?", f"City{i}", "bridge", f"<answer>City{i}</answer>")
       for i in range(4)}
TRAIN = {f"t{i}": (f"Which city did band T{i} first play in?", f"Town{i}", "bridge", "") for i in range(3)}


def counting(rows: dict, right: bool = True) -> tuple[FakeChatModel, list[str]]:
    """A model that answers each question of `rows` (wrongly unless `right`), and the questions it was asked."""
    asked: list[str] = []

    def respond(messages) -> str:
        text = messages[-1].text.rsplit("Question:", 1)[-1]  # not the passages, which hold other questions
        found = [(q, a) for q, a, _, _ in rows.values() if q in text]
        asked.extend(q for q, _ in found)
        return f"<answer>{found[0][1] if found and right else 'Nowhere'}</answer>"

    return FakeChatModel(respond=respond), asked


@pytest.fixture()
def slices(tmp_path) -> tuple[RolloutConfig, DevConfig]:
    rollout = RolloutConfig(agent="rag", dataset="hotpotqa", path=str(write_dataset(tmp_path / "train.jsonl", TRAIN)),
                            store=f"embedded://{tmp_path}/s?embedder=hash", max_new_tokens=16)
    dev = DevConfig(path=str(write_dataset(tmp_path / "dev.jsonl", DEV)), limit=4, min_questions=4)
    return rollout, dev


def untrained(rollout, dev, out, model: tuple[FakeChatModel, list[str]] | None, config=None) -> dict:
    """The untrained dev run; `model` None: asking any model fails the test."""
    def llms(folder):
        assert model is not None, "the cached untrained run was redone"
        return model[0], None

    return dev_module.dev_run(rollout, dev, config or ModelConfig(name="tiny"), None, out, dev_module.UNTRAINED, llms)


def test_the_untrained_run_is_reused_until_its_key_changes(slices, tmp_path):
    rollout, dev = slices
    first = counting(DEV)
    miss = untrained(rollout, dev, tmp_path / "runs" / "a", first)
    assert not miss["dev_reused"] and miss["dev_f1"] == 1.0 and len(first[1]) == 4
    folder = Path(miss["dev_run"])
    assert folder.parent == tmp_path / "runs" / "untrained"  # beside the output folders: shared by the runs
    key = json.loads((folder / "key.json").read_text())
    assert key["agent"] == "rag" and key["start"] == 0 and key["limit"] == 4 and key["temperature"] == 0.0
    assert key["policy"]["name"] == "tiny" and key["guards"] == sorted(key["guards"])

    hit = untrained(rollout, dev, tmp_path / "runs" / "b", None)  # another training run of the same slice
    assert hit["dev_reused"] and hit["dev_run"] == miss["dev_run"] and hit["dev_f1"] == 1.0

    changed = {"slice": (rollout, dataclasses.replace(dev, limit=3, min_questions=3), None),
               "guards": (dataclasses.replace(rollout, context={"guards": "none"}), dev, None),
               "decoding": (dataclasses.replace(rollout, max_new_tokens=32), dev, None),
               "policy": (rollout, dev, ModelConfig(name="tiny", seed=1)),
               "agent": (dataclasses.replace(rollout, agent="direct"), dev, None)}
    folders = {miss["dev_run"]}
    for what, (r, d, config) in changed.items():
        model = counting(DEV)
        out = untrained(r, d, tmp_path / "runs" / "a", model, config)
        assert not out["dev_reused"] and model[1], what
        folders.add(out["dev_run"])
    assert len(folders) == 1 + len(changed)

    data = Path(dev.path)  # the dev file touched (copied, synced): the same questions
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 10**9))
    assert untrained(rollout, dev, tmp_path / "runs" / "a", None)["dev_reused"]
    data.write_text(data.read_text() + "\n")  # rewritten: its questions may have changed
    assert not untrained(rollout, dev, tmp_path / "runs" / "a", counting(DEV))["dev_reused"]


def test_a_dev_run_hashes_the_dev_file_once(slices, tmp_path, monkeypatch):
    from mhqa_graph import paths

    hashed: list[Path] = []
    digest = paths.file_sha256
    monkeypatch.setattr(paths, "file_sha256", lambda path: hashed.append(Path(path)) or digest(path))
    rollout, dev = slices
    assert not untrained(rollout, dev, tmp_path / "runs" / "a", counting(DEV))["dev_reused"]
    assert hashed == [Path(dev.path).resolve()]  # a miss: the key's folder, then its key.json, from one key


def test_an_interrupted_untrained_run_resumes_and_trained_runs_are_compared_with_it(slices, tmp_path):
    rollout, dev = slices
    out = tmp_path / "runs" / "mygo"
    folder = Path(untrained(rollout, dev, out, counting(DEV, right=False))["dev_run"])
    results = folder / "sample0" / "results.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    results.write_text("".join(lines[:2]))  # interrupted after two questions
    again = counting(DEV, right=False)
    resumed = untrained(rollout, dev, out, again)
    assert not resumed["dev_reused"] and len(again[1]) == 2 and resumed["dev_questions"] == 4
    assert "dev_df1" not in resumed

    trained = dev_module.dev_run(rollout, dev, ModelConfig(name="tiny"), None, out, "iter1",
                             lambda folder: (counting(DEV)[0], None))
    assert (out / "dev" / "iter1" / "sample0" / "results.jsonl").is_file()
    assert trained["dev_f1"] == 1.0 and trained["dev_df1"] == pytest.approx(100.0)
    assert (trained["dev_better"], trained["dev_worse"], trained["dev_paired"]) == (4, 0, 4)
    assert trained["dev_df1_low"] == trained["dev_df1_high"] == pytest.approx(100.0)
    assert trained["dev_sign_p"] == sign_test(4, 0)
    assert dev_module.dev_run(rollout, DevConfig(), ModelConfig(name="tiny"), None, out, "iter1", None) == {}


def test_a_dev_run_stopped_on_one_machine_replays_its_calls_from_the_committed_call_cache(slices, tmp_path):
    """With dev.llm_cache, a dev run on a machine without the first one's run folders asks the model nothing that
    the first one asked: the committed cache replies (its calls are greedy), the records agree, the key and the
    untrained cache's folder do not count the cache, and the file holds every reply without its write-ahead log."""
    import sqlite3

    rollout, base = slices
    cache = tmp_path / "docs" / "runs" / "r" / "calls.sqlite"
    dev = dataclasses.replace(base, records=str(cache.parent), llm_cache=str(cache))
    first = counting(DEV)
    plain = untrained(rollout, base, tmp_path / "plain" / "mygo", counting(DEV))
    ran = untrained(rollout, dev, tmp_path / "here" / "mygo", first)
    assert len(first[1]) == 4 and Path(ran["dev_run"]).name == Path(plain["dev_run"]).name  # the same key
    with sqlite3.connect(cache) as db:  # checkpointed when the run was published: the file alone holds them
        assert db.execute("SELECT count(*) FROM calls").fetchone()[0] == 4
    assert not Path(f"{cache}-wal").exists() or Path(f"{cache}-wal").stat().st_size == 0

    (cache.parent / f"{dev_module.UNTRAINED}.jsonl.gz").unlink()  # the records not committed: only the cache
    again = counting(DEV)
    elsewhere = untrained(rollout, dev, tmp_path / "there" / "mygo", again)
    assert not elsewhere["dev_reused"] and again[1] == []  # run again, every call from the cache
    assert elsewhere["dev_f1"] == ran["dev_f1"] == 1.0 and elsewhere["dev_llm_calls"] == ran["dev_llm_calls"]


def test_dev_runs_are_published_as_records_to_commit_and_tabled_by_training_runs(slices, tmp_path, capsys):
    """With dev.records, each dev run leaves its compact records, the log and the policy's seed in a folder to
    commit; training/runs.py tables them against the run before and the untrained one, paired by question."""
    from mhqa_graph.training import runs

    from mhqa_graph.eval.records import load

    rollout, base = slices
    dev = dataclasses.replace(base, records=str(tmp_path / "docs" / "runs" / "r"))
    out = tmp_path / "runs" / "mygo"
    out.mkdir(parents=True)
    (out / logs.LOG).write_text(json.dumps({"event": "dev", "after": "iter2"}) + "\n"
                                  + json.dumps({"event": "dev", "after": "iter1"}) + "\n")
    untrained(rollout, dev, out, counting(DEV, right=False))
    for name, right in (("iter1", True), ("iter2", False)):
        dev_module.dev_run(rollout, dev, ModelConfig(name="tiny", seed=7), None, out, name,
                       lambda folder, right=right: (counting(DEV, right)[0], None))
    published = Path(dev.records)
    assert sorted(p.name for p in published.iterdir()) == ["iter1.jsonl.gz", "iter2.jsonl.gz", "log.jsonl",
                                                          "model.json", "untrained.jsonl.gz",
                                                          "untrained.key.json"]
    rows = load(published / "iter1.jsonl.gz")
    assert len(rows) == 4 and all(r["f1"] == 1.0 and "trace" not in r and r["cluster"] for r in rows)
    assert json.loads((published / "model.json").read_text())["seed"] == 7

    assert list(runs.dev_runs(published)) == ["untrained", "iter2", "iter1"]  # untrained first, then as logged
    runs.main([str(published), "--pair", "untrained", "iter1"])
    printed = capsys.readouterr().out
    assert "| iter1 | 4 (4) | 100.0 | 100.0 |" in printed and "| iter2 | 4 (4) | 0.0 |" in printed
    assert "`untrained` → `iter1`: ΔF1 +100.0 [+100.0, +100.0] (4 q, 4 clusters; 4 better, 0 worse)" in printed
    with pytest.raises(InvalidInput, match="no dev run iter9"):
        runs.main([str(published), "--pair", "iter9", "iter1"])
    with pytest.raises(InvalidInput, match="holds no dev records"):
        runs.dev_runs(tmp_path)


def test_a_finished_run_publishes_its_adapter_and_whole_log(tmp_path):
    """A LoRA policy's adapter goes beside the records (small enough to commit); full weights do not."""
    records, out = tmp_path / "docs" / "runs" / "r", tmp_path / "out"
    out.mkdir()
    (out / logs.LOG).write_text('{"event": "saved"}\n')
    lora, _ = policy.load_model(ModelConfig(name="tiny", lora=True, lora_r=4))
    dev_module.publish_final(DevConfig(records=str(records)), lora, out)
    assert (records / "adapter" / "adapter_config.json").is_file()
    assert (records / "adapter" / "adapter_model.safetensors").stat().st_size < 2**20
    assert (records / logs.LOG).read_text() == '{"event": "saved"}\n'

    full, _ = policy.load_model(ModelConfig(name="tiny", lora=False))
    dev_module.publish_final(DevConfig(records=str(tmp_path / "full")), full, out)
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == [logs.LOG]
    dev_module.publish_final(DevConfig(), lora, out)  # no records folder: nothing written

    from peft import LoraConfig  # MAPGRPO: one adapter a role; only the trained ones are published

    lora.add_adapter("analysis", LoraConfig(r=4, target_modules=["q_proj"]))
    dev_module.publish_final(DevConfig(records=str(tmp_path / "roles")), lora, out, adapters=["analysis"])
    assert (tmp_path / "roles" / "adapter" / "analysis" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "roles" / "adapter" / "adapter_model.safetensors").exists()  # the untrained default


# -- dev slices -----------------------------------------------------------------------------------------
def test_dev_slices_must_be_large_enough_and_disjoint_from_training(slices):
    rollout, dev = slices
    dev_module.check_disjoint(rollout, dev)
    with pytest.raises(DevSliceError, match="holds 4 question"):
        dev_module.check_disjoint(rollout, dataclasses.replace(dev, min_questions=100))
    with pytest.raises(DevSliceError, match="holds 2 question"):
        dev_module.check_disjoint(rollout, dataclasses.replace(dev, start=2, limit=None))  # the file has 4
    assert DevConfig().min_questions == 100 and issubclass(DevSliceError, InvalidInput)
    same_file = dataclasses.replace(rollout, path=dev.path, start=3, limit=1)  # d3: inside the dev slice
    with pytest.raises(DevSliceError, match="share 1 question"):
        dev_module.check_disjoint(same_file, dev)
    dev_module.check_disjoint(dataclasses.replace(same_file, start=3),
                              dataclasses.replace(dev, limit=3, min_questions=3))
    dev_module.check_disjoint(rollout, DevConfig())  # no dev slice: nothing to check


def test_the_guards_off_run_asks_the_trained_policy_without_guards(slices, tmp_path):
    """`dev.guards_off`: the trained policy's run with guards "none", compared with the untrained run (guards on)."""
    rollout, dev = slices
    untrained(rollout, dev, tmp_path / "runs" / "a", counting(DEV, right=False))
    model = counting(DEV)
    metrics = dev_module.dev_run(rollout, dev, ModelConfig(name="tiny"), None, tmp_path / "runs" / "a",
                                 dev_module.GUARDS_OFF, lambda folder: (model[0], None))
    assert metrics["dev_f1"] == 1.0 and metrics["dev_df1"] == pytest.approx(100.0) and metrics["dev_guarded"] == 0
    run = json.loads((tmp_path / "runs" / "a" / "dev" / dev_module.GUARDS_OFF / "sample0" / "run.json").read_text())
    assert run["settings"]["guards"] == "none"


def test_the_untrained_guards_off_run_is_the_2x2s_fourth_cell_and_every_cell_asks_every_question(slices, tmp_path):
    """`untrained_runs` with `dev.guards_off`: the untrained policy with guards "none" too, cached apart from the
    run with guards on (its key names the guards) and compared with it; no cell takes answers over from another."""
    rollout, dev = slices
    dev = dataclasses.replace(dev, guards_off=True)
    out = tmp_path / "runs" / "a"
    asked = {}

    def run(name):
        asked[name] = counting(DEV, right=name == dev_module.UNTRAINED)
        return dev_module.dev_run(rollout, dev, ModelConfig(name="tiny"), None, out, name,
                                  lambda folder: (asked[name][0], None))

    before = dev_module.untrained_runs(dev, run)
    assert list(before) == [dev_module.UNTRAINED, dev_module.UNTRAINED_GUARDS_OFF]
    on, off = (Path(before[n]["dev_run"]) for n in before)
    assert on != off and on.parent == off.parent == tmp_path / "runs" / "untrained"
    assert json.loads((off / "sample0" / "run.json").read_text())["settings"]["guards"] == "none"
    assert before[dev_module.UNTRAINED_GUARDS_OFF]["dev_df1"] == pytest.approx(-100.0)  # against guards on
    assert all(len(asked[n][1]) == 4 for n in before)
    trained = run(dev_module.GUARDS_OFF)
    assert len(asked[dev_module.GUARDS_OFF][1]) == 4 and "dev_carried" not in trained
    assert list(dev_module.untrained_runs(dataclasses.replace(dev, guards_off=False), run)) == ["untrained"]

    def cached(name):  # a second training on the slice reads both untrained runs back
        return dev_module.dev_run(rollout, dev, ModelConfig(name="tiny"), None, out, name,
                                  lambda folder: pytest.fail("the cached untrained run was redone"))

    assert all(m["dev_reused"] for m in dev_module.untrained_runs(dev, cached).values())



def test_training_runs_prints_the_2x2_when_all_four_cells_ran(tmp_path, capsys):
    from mhqa_graph.training import runs

    from mhqa_graph.eval.records import write

    f1s = {"untrained": [0, 0, 1, 1], "untrained_guards_none": [0, 0, 0, 1], "stage1": [1, 1, 1, 1],
           "final_guards_none": [1, 1, 0, 1]}
    for name, scores in f1s.items():
        write(tmp_path / f"{name}.jsonl.gz", [{"id": f"q{i}", "f1": f, "em": f, "llm_calls": 2}
                                              for i, f in enumerate(scores)])
    runs.main([str(tmp_path)])
    printed = capsys.readouterr().out
    assert "| untrained | 50.0 | 25.0 |" in printed and "| trained (`stage1`) | 100.0 | 75.0 |" in printed
    assert "training, guards none: ΔF1 +50.0" in printed and "the guards, trained: ΔF1 +25.0" in printed
    assert "trained without guards against untrained with them: ΔF1 +25.0" in printed
    (tmp_path / "untrained_guards_none.jsonl.gz").unlink()  # a cell missing: no 2x2
    runs.main([str(tmp_path)])
    assert "guards none |" not in capsys.readouterr().out


def test_training_runs_pairs_a_dev_run_with_another_runs(tmp_path, capsys):
    """`--pair control/stage2 stage1`: an algorithm's stage against a control run beside it (the same extra steps
    of SFT instead), paired by question."""
    from mhqa_graph.training import runs

    from mhqa_graph.eval.records import write

    for folder, name, scores in (("run", "untrained", [0, 0, 0, 0]), ("run", "stage1", [1, 1, 0, 1]),
                                 ("control", "stage2", [1, 0, 0, 1])):
        write(tmp_path / folder / f"{name}.jsonl.gz", [{"id": f"q{i}", "f1": f, "em": f}
                                                        for i, f in enumerate(scores)])
    runs.main([str(tmp_path / "run"), "--pair", "control/stage2", "stage1"])
    printed = capsys.readouterr().out
    assert "`control/stage2` → `stage1`: ΔF1 +25.0" in printed and "| control/stage2 |" not in printed
    with pytest.raises(InvalidInput, match="no records"):
        runs.main([str(tmp_path / "run"), "--pair", "control/stage9", "stage1"])


def test_training_runs_tables_how_the_answers_came_about(tmp_path, capsys):
    """`--answers`: per dev run, the questions forced to an answer (and the reasons), the answers that say there is
    none and the questions a guard fired on, from the records' health."""
    from mhqa_graph.training import runs

    from mhqa_graph.eval.records import write

    health = [{"forced": 1, "forced_by": ["NoProgress", "NoProgress"]}, {"forced": 1, "forced_by": ["RoundCap"]},
              {"forced": 0, "forced_by": [], "guards": {"answer": 1}}, {}]
    write(tmp_path / "untrained.jsonl.gz", [{"id": f"q{i}", "f1": 0, "em": 0, "prediction": p, "health": h}
                                            for i, (p, h) in enumerate(zip(["unknown", "x", "Not stated.", "y"],
                                                                           health))])
    runs.main([str(tmp_path), "--answers"])
    assert "| untrained | 2 of 4 | NoProgress 1, RoundCap 1 | 2 | 1 |" in capsys.readouterr().out
    runs.main([str(tmp_path)])
    assert "forced to answer" not in capsys.readouterr().out


def test_a_machine_without_the_untrained_cache_reads_the_committed_records_of_the_same_key(slices, tmp_path):
    """A run on another machine (no `runs/` folder) takes the untrained run's published compact records when their
    key is its own, compares its trained runs with them, and asks the model again when the key differs."""
    import shutil

    rollout, base = slices
    dev = dataclasses.replace(base, records=str(tmp_path / "docs" / "runs" / "r"))
    out = tmp_path / "runs" / "mygo"
    first = untrained(rollout, dev, out, counting(DEV, right=False))
    assert (Path(dev.records) / "untrained.key.json").is_file()
    shutil.rmtree(tmp_path / "runs")  # the machine is gone; the records were committed
    elsewhere = tmp_path / "another" / "checkout" / "dev.jsonl"  # the same file in another checkout
    elsewhere.parent.mkdir(parents=True)
    shutil.copyfile(dev.path, elsewhere)
    dev = dataclasses.replace(dev, path=str(elsewhere))

    again = untrained(rollout, dev, out, None)  # asking the model fails the test
    assert again["dev_reused"] and again["dev_run"] == str(Path(dev.records) / "untrained.jsonl.gz")
    assert again["dev_f1"] == first["dev_f1"] == 0.0 and again["dev_questions"] == 4
    trained = dev_module.dev_run(rollout, dev, ModelConfig(name="tiny"), None, out, "iter1",
                                 lambda folder: (counting(DEV)[0], None))
    assert trained["dev_df1"] == pytest.approx(100.0) and trained["dev_paired"] == 4

    other = dataclasses.replace(rollout, max_new_tokens=32)  # another key: asked afresh
    asked = counting(DEV, right=False)
    assert not untrained(other, dev, out, asked)["dev_reused"] and len(asked[1]) == 4


def test_training_runs_tables_the_steps_of_the_log(tmp_path, capsys):
    from mhqa_graph.training import runs

    from mhqa_graph.eval.records import write

    write(tmp_path / "untrained.jsonl.gz", [{"id": "q0", "f1": 0.0, "em": 0.0}])
    (tmp_path / "log.jsonl").write_text("\n".join(json.dumps(e) for e in [
        {"role": "analysis", "step": 0, "eval_reward": 0.25}, {"role": "analysis", "step": 1, "reward": 0.5,
                                                               "reward_std": 0.1, "loss": 0.01, "grad_norm": 0.9},
        {"event": "dev", "after": "analysis", "dev_f1": 0.3}]) + "\n{cut sho")
    runs.main([str(tmp_path), "--steps"])
    printed = capsys.readouterr().out
    assert "| analysis | 0 |  |  | 0.250 |  |  |" in printed
    assert "| analysis | 1 | 0.500 | 0.100 |  | 0.010 | 0.900 |" in printed and printed.count("| analysis |") == 2



def test_training_runs_tables_a_teachers_committed_samples(tmp_path, capsys):
    from mhqa_graph.training import runs

    from mhqa_graph.eval.records import write

    write(tmp_path / "untrained.jsonl.gz", [{"id": "q0", "f1": 0.0, "em": 0.0}])
    teacher = tmp_path / "warmup_rollouts" / "teacher-x"
    teacher.mkdir(parents=True)
    (teacher / "made_with.json").write_text(json.dumps({"teacher": "llamacpp:big", "temperature": 0.8, "seed": 0}))
    for j, ems in enumerate(([1, 0], [1, 1])):
        write(teacher / f"sample{j}.jsonl.gz", [{"id": f"q{i}", "em": e, "f1": e / 2 + 0.25, "llm_calls": 3 + j}
                                                for i, e in enumerate(ems)])
    runs.main([str(tmp_path)])
    printed = capsys.readouterr().out
    assert "| llamacpp:big | 0.8 | sample0 | 2 | 1 | 50.0 | 3.00 |" in printed
    assert "| llamacpp:big | 0.8 | sample1 | 2 | 2 | 75.0 | 4.00 |" in printed


def test_training_runs_tables_mygos_iterations_from_the_log(tmp_path, capsys):
    from mhqa_graph.training import runs

    from mhqa_graph.eval.records import write

    write(tmp_path / "untrained.jsonl.gz", [{"id": "q0", "f1": 0.0, "em": 0.0}])
    (tmp_path / "log.jsonl").write_text("\n".join(json.dumps(e) for e in [
        {"phase": "warmup", "step": 1, "loss": 0.9},
        {"iteration": 0, "warmup_rows": 99, "loss": 0.583, "dev_f1": 0.3},
        {"iteration": 1, "tau": 0.5, "mean_reward": 0.337, "trajectories": 96, "with_workers": 90, "kept": 31,
         "sft_rows": 123, "loss": 0.2, "failures": 0, "rollout_s": 1900.0, "sft_s": 2700.5, "dev_f1": 0.4}]) + "\n")
    runs.main([str(tmp_path)])
    printed = capsys.readouterr().out
    assert "| 0 |  |  |  |  |  |  | 99 | 0.583 |  |  |  |" in printed
    assert "| 1 | 0.500 | 0.337 | 96 | 90 | 31 | 123 |  | 0.200 | 0 | 1900 | 2700 |" in printed


def test_another_run_reads_the_untrained_records_that_a_run_beside_it_committed(slices, tmp_path):
    """A run whose records folder has no untrained run (a control, say) takes the one committed beside it, in
    another run's folder, when the key is its own, and keeps a copy in its own folder."""
    import shutil

    rollout, base = slices
    main = dataclasses.replace(base, records=str(tmp_path / "docs" / "runs" / "main"))
    first = untrained(rollout, main, tmp_path / "runs" / "main", counting(DEV, right=False))
    shutil.rmtree(tmp_path / "runs")  # another machine

    control = dataclasses.replace(base, records=str(tmp_path / "docs" / "runs" / "control"))
    again = untrained(rollout, control, tmp_path / "runs" / "control", None)  # asking the model fails the test
    assert again["dev_reused"] and again["dev_run"] == str(Path(main.records) / "untrained.jsonl.gz")
    assert again["dev_f1"] == first["dev_f1"] and again["dev_questions"] == 4
    assert (Path(control.records) / "untrained.jsonl.gz").read_bytes() == \
        (Path(main.records) / "untrained.jsonl.gz").read_bytes()
    assert (Path(control.records) / "untrained.key.json").is_file()
