"""The GPU path, checked on a CPU-only machine: every tensor a chat model builds goes to the model's device (a
model on the `meta` device stands for a GPU), dtype `auto` and TRL's use_cpu/bf16 follow the device, the
policy loads from a folder or a Hugging Face Hub id (offline when HF_HUB_OFFLINE is set), a failure of the
device during a rollout stops training with TrainingError instead of being scored 0, and under several
processes only the main one rolls out."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")
import torch  # noqa: E402
from langchain_core.messages import HumanMessage, SystemMessage  # noqa: E402
from mhqa_graph.training import devices, policy  # noqa: E402
from mhqa_graph.training.configs import ModelConfig, RolloutConfig  # noqa: E402
from mhqa_graph.training.devices import policy_dtype, precision_args  # noqa: E402
from mhqa_graph.training.mapgrpo import MAPGRPOConfig, RoleChatModel, RoleRewards, grpo_args  # noqa: E402
from mhqa_graph.training.omne import GRPO_DEFAULTS, EpisodeModel, OmneConfig, OmneEnvironment, OmneTrainer  # noqa: E402
from mhqa_graph.training.policy import load_model, policy_source  # noqa: E402
from mhqa_graph.training.rollouts import rollouts  # noqa: E402
from mhqa_graph.training.tiny import tiny_tokenizer  # noqa: E402
from test_mapgrpo import env  # noqa: E402,F401  (a fixture)
from test_omne_training import wiki_row  # noqa: E402

from mhqa_graph.errors import DeviceError, InvalidInput, ModelNotFound, TrainingError  # noqa: E402
from mhqa_graph.models.chat import TransformersChatModel, device_fault, model_device  # noqa: E402
from mhqa_graph.store import open_store  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
TWO_DEVICES = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


class DeviceModel(torch.nn.Module):
    """A causal LM whose weights are on `device` (`meta`: no memory and no data, like a GPU here): `generate`
    records the device of every tensor it is given and replies with the end-of-turn token, or raises `fail`."""

    def __init__(self, eos: int, device: str = "meta", fail: str | None = None) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4, device=device)
        self.config = SimpleNamespace(max_position_embeddings=4096)
        self.generation_config = SimpleNamespace(eos_token_id=eos)
        self.eos, self.fail, self.seen = eos, fail, []

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.embed

    def generate(self, **kwargs):
        self.seen.append({k: v.device.type for k, v in kwargs.items() if torch.is_tensor(v)})
        if self.fail:
            raise RuntimeError(self.fail)
        return torch.tensor([[0] * kwargs["input_ids"].shape[1] + [self.eos]])


# -- inputs on the model's device ------------------------------------------------------------------
@pytest.mark.parametrize("cls", [TransformersChatModel, RoleChatModel, EpisodeModel])
def test_every_tensor_a_chat_model_builds_is_on_the_models_device(cls, tokenizer):
    model = DeviceModel(tokenizer.eos_token_id)
    llm = cls.from_loaded(model, tokenizer, max_new_tokens=4)
    llm.invoke([SystemMessage("Answer."), HumanMessage("Who?")])
    assert model.seen == [{"input_ids": "meta", "attention_mask": "meta"}]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu_check.sh)")
@pytest.mark.parametrize("cls", [TransformersChatModel, RoleChatModel, EpisodeModel])
def test_on_a_gpu_the_tiny_policy_is_there_in_its_dtype_and_generates_there(cls):
    model, tokenizer = load_model(ModelConfig(name="tiny", lora_r=2))
    assert model_device(model) == devices.policy_device() and model_device(model).type == "cuda"
    assert model.get_input_embeddings().weight.dtype == policy_dtype("auto")
    llm = cls.from_loaded(model, tokenizer, max_new_tokens=4)
    llm.invoke([SystemMessage("Answer."), HumanMessage("Who?")])
    assert llm.device_fault is None


def test_a_device_failure_is_typed_and_remembered_and_other_failures_are_not(tokenizer):
    llm = TransformersChatModel.from_loaded(DeviceModel(tokenizer.eos_token_id, fail=TWO_DEVICES), tokenizer)
    with pytest.raises(DeviceError, match="same device"):
        llm.invoke([HumanMessage("Who?")])
    assert "cuda:0 and cpu" in llm.device_fault
    other = TransformersChatModel.from_loaded(DeviceModel(tokenizer.eos_token_id, fail="backend down"), tokenizer)
    with pytest.raises(RuntimeError, match="backend down"):
        other.invoke([HumanMessage("Who?")])
    assert other.device_fault is None
    for message in (TWO_DEVICES, "expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16",
                    "CUDA out of memory. Tried to allocate 2.00 GiB", "\"addmm_impl_cpu_\" not implemented for 'Half'"):
        assert device_fault(RuntimeError(message))
    assert not device_fault(RuntimeError("backend down")) and not device_fault(ValueError("device"))


# -- dtype, device and TRL precision -----------------------------------------------------------------
def cuda(monkeypatch, available: bool, bf16: bool = True) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)


def test_dtype_auto_is_float32_on_the_cpu_and_bfloat16_on_a_gpu_that_has_it(monkeypatch):
    cuda(monkeypatch, False)
    assert devices.policy_device().type == "cpu" and policy_dtype("auto") == torch.float32
    assert precision_args({}) == {"use_cpu": True, "bf16": False}
    cuda(monkeypatch, True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert devices.policy_device() == torch.device("cuda", 1)
    assert policy_dtype("auto") == torch.bfloat16 and policy_dtype("float32") == torch.float32
    checkpointing = {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"use_reentrant": False}}
    assert precision_args({}) == {"use_cpu": False, "bf16": True} | checkpointing
    assert precision_args({"bf16": False, "use_cpu": True, "activation_checkpointing": False}) == {}  # a config wins
    assert precision_args({"fp16": True}) == {"use_cpu": False, "bf16": False} | checkpointing
    cuda(monkeypatch, True, bf16=False)
    assert policy_dtype("auto") == torch.float32 and precision_args({})["bf16"] is False
    with pytest.raises(InvalidInput, match="model.dtype"):
        policy_dtype("fp8")
    assert ModelConfig().dtype == "auto"


def test_on_the_cpu_the_trainers_train_in_float32_on_the_cpu_as_before(monkeypatch, tmp_path):
    cuda(monkeypatch, False)
    args = grpo_args(MAPGRPOConfig(grpo={"num_generations": 2, "per_device_train_batch_size": 2}), tmp_path)
    assert (args.use_cpu, args.bf16) == (True, False)
    from trl import GRPOConfig

    omne = SimpleNamespace(config=OmneConfig(rollout=RolloutConfig(agent="omne", path="x")), out=tmp_path)
    args = OmneTrainer._trl_args(omne, GRPOConfig, GRPO_DEFAULTS, {"num_generations": 2}, 1)
    assert (args.use_cpu, args.bf16) == (True, False)  # TRL's own default would be bf16
    from mhqa_graph.training.mygo import SFT_DEFAULTS

    assert "bf16" not in SFT_DEFAULTS and "use_cpu" not in SFT_DEFAULTS
    import yaml

    configs = {p.relative_to(ROOT).as_posix(): yaml.safe_load(p.read_text())
               for p in (ROOT / "configs" / "train").rglob("*.yaml")}
    forced = {(name, key, section[key]) for name, c in configs.items() for section in c.values()
              if isinstance(section, dict) for key in ("use_cpu", "bf16") if key in section}
    # The shipped configs leave precision to the device; a recorded learning run may ask for bf16 autocast
    # (it runs on an AVX512-BF16 CPU and on any bf16 GPU alike), never pin the CPU.
    assert len(configs) >= 8 and all(name.startswith("configs/train/learn/") and key == "bf16" and value is True
                                     for name, key, value in forced), forced
    from accelerate.commands.config.config_args import load_config_from_file

    launch = load_config_from_file(str(ROOT / "configs" / "accelerate" / "multi_gpu.yaml"))
    assert launch.distributed_type == "MULTI_GPU" and launch.mixed_precision == "no"  # bf16 is the trainers' call


def test_the_policy_is_loaded_on_its_device_in_its_dtype(monkeypatch):
    monkeypatch.setattr(policy, "policy_device", lambda: torch.device("meta"))  # stands for cuda:N
    model, _ = load_model(ModelConfig(name="tiny", lora=False))
    assert {p.device.type for p in model.parameters()} == {"meta"} and model.dtype == torch.float32
    model, _ = load_model(ModelConfig(name="tiny", lora=True, lora_r=2, dtype="bfloat16"))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16


# -- the policy from a folder or a hub id ------------------------------------------------------------
def offline(monkeypatch, on: bool) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    if on:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_the_policy_comes_from_a_folder_or_a_hub_id(monkeypatch, tmp_path):
    offline(monkeypatch, False)
    assert policy_source(str(tmp_path)) == (str(tmp_path), True)
    assert policy_source("Qwen/Qwen2.5-7B-Instruct") == ("Qwen/Qwen2.5-7B-Instruct", False)  # may download
    offline(monkeypatch, True)
    assert policy_source("Qwen/Qwen2.5-7B-Instruct") == ("Qwen/Qwen2.5-7B-Instruct", True)  # the cache only
    for name in (str(tmp_path / "missing" / "model"), "not a name!"):
        with pytest.raises(ModelNotFound, match="neither a chat pack"):
            policy_source(name)


def test_a_hub_id_is_downloaded_unless_offline_and_a_miss_is_modelnotfound(monkeypatch, tokenizer):
    import transformers
    from mhqa_graph.training.tiny import tiny_model_and_tokenizer

    calls = []

    def loader(result):
        def from_pretrained(name, **kwargs):
            calls.append((name, kwargs))
            if result is None:
                raise OSError(f"{name} is not a local folder and is not a valid model identifier")
            return result
        return from_pretrained

    cuda(monkeypatch, False)
    model, _ = tiny_model_and_tokenizer()
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", loader(tokenizer))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loader(model))
    offline(monkeypatch, False)
    loaded, _ = load_model(ModelConfig(name="Qwen/Qwen2.5-7B-Instruct", lora=False))
    assert loaded is model
    assert [(n, k["local_files_only"]) for n, k in calls] == [("Qwen/Qwen2.5-7B-Instruct", False)] * 2
    assert calls[1][1]["dtype"] == torch.float32 and "device_map" not in calls[1][1]  # on the CPU, as before
    offline(monkeypatch, True)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", loader(None))
    with pytest.raises(ModelNotFound, match="no copy in the local cache .HF_HUB_OFFLINE is set"):
        load_model(ModelConfig(name="Qwen/Qwen2.5-7B-Instruct"))
    assert calls[-1][1]["local_files_only"] is True


# -- a device failure during a rollout stops training ------------------------------------------------
@pytest.fixture(scope="module")
def hotpot(request) -> dict:
    """test_mapgrpo's tiny HotpotQA file and the hash-embedder store holding its corpus."""
    return request.getfixturevalue("env")


def test_a_rollout_whose_policy_fails_on_its_device_raises_instead_of_scoring_0(hotpot, tokenizer, tmp_path):
    config = RolloutConfig(agent="rag", dataset="hotpotqa", path=str(hotpot["data"]), store=hotpot["store"], limit=2)
    llm = TransformersChatModel.from_loaded(DeviceModel(tokenizer.eos_token_id, fail=TWO_DEVICES), tokenizer)
    with pytest.raises(TrainingError, match="model failed during a rollout .*same device.*rerun rolls out afresh"):
        rollouts(config, llm, tmp_path / "r")
    assert not (tmp_path / "r" / "sample0").exists() and (tmp_path / "r" / "sample0.device-error").is_dir()
    ok = TransformersChatModel.from_loaded(DeviceModel(tokenizer.eos_token_id, fail="backend down"), tokenizer)
    records = rollouts(config, ok, tmp_path / "ok")  # any other failure is the question's, recorded as before
    assert len(records) == 2 and all(r["f1"] == 0 for r in records)


def test_mygo_stops_when_the_policy_fails_on_its_device(tmp_path, monkeypatch):
    from mhqa_graph.training.mygo import MyGOTrainer
    from test_mygo import tiny_config

    trainer = MyGOTrainer(tiny_config(tmp_path, iterations=1))

    def generate(**kwargs):
        raise RuntimeError(TWO_DEVICES)

    monkeypatch.setattr(trainer.model, "generate", generate)
    with pytest.raises(TrainingError, match="same device"):
        trainer.train()
    assert not (Path(trainer.config.output_dir) / "iter1" / "checkpoint").exists()  # nothing trained on


def test_a_plan_execution_on_a_failing_device_is_no_0_reward(hotpot, tokenizer):
    cfg = MAPGRPOConfig()
    cfg.rollout.context = {"max_rounds": 2, "max_rewrites": 1}
    executor = RoleChatModel.from_loaded(DeviceModel(tokenizer.eos_token_id, fail=TWO_DEVICES), tokenizer)
    with open_store(hotpot["store"], read_only=True) as store:
        rewards = RoleRewards(cfg, store, hotpot["corpus"], None, executor)
        with pytest.raises(TrainingError, match="same device"):
            rewards.plan([json.dumps({"subgoals": ["Who founded Gamma Records?"]})],
                         question=["Who founded Gamma Records?"], answers=[["John Smith"]], chain=["[]"])


def test_an_omne_episode_on_a_failing_device_stops_training(tmp_path, tokenizer):
    data = tmp_path / "dev_evidences.json"
    data.write_text(json.dumps([wiki_row("1")]))
    rollout = RolloutConfig(agent="omne", dataset="2wiki", path=str(data), store=f"embedded://{tmp_path}/s?embedder=hash",
                            max_new_tokens=16)
    with open_store(rollout.store) as store:
        env = OmneEnvironment(rollout, store)
        prompt = next(iter(env.questions))
        with pytest.raises(TrainingError, match="device or dtype during an episode .*same device"):
            env.episode(DeviceModel(tokenizer.eos_token_id, fail=TWO_DEVICES), tokenizer, prompt, budget=512)


# -- several processes: the main one rolls out -------------------------------------------------------
WORKER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from mhqa_graph.errors import TrainingError
    from mhqa_graph.testing.fakes import FakeChatModel
    from mhqa_graph.training.configs import RolloutConfig
    from mhqa_graph.training.rollouts import rollouts
    from mhqa_graph.training.logs import write_log
    from mhqa_graph.training.devices import on_main_process

    data, store, out, rank = sys.argv[1:5]
    calls = []

    def respond(messages):
        calls.append(1)
        return "<answer>Tulsa</answer>"

    config = RolloutConfig(agent="rag", dataset="hotpotqa", path=data, store=store, limit=3)
    records = rollouts(config, FakeChatModel(respond=respond), Path(out) / "rollouts")
    write_log(Path(out) / "log.jsonl", {"rank": rank})
    try:
        on_main_process(lambda: 1 / 0)
        failed = None
    except Exception as exc:
        failed = type(exc).__name__
    shared = on_main_process(lambda: "main's", share=True)
    print(json.dumps({"calls": len(calls), "ids": [r["id"] for r in records], "failed": failed, "shared": shared}))
""")


def test_under_two_processes_only_the_main_one_rolls_out_and_both_get_its_records(hotpot, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):  # -P: the installed package, not the source folder in the cwd (no graphs/ or training/)
        launch = {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(port), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-P", "-c", WORKER, str(hotpot["data"]), hotpot["store"],
                                       str(tmp_path), str(rank)], env=os.environ | launch, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)  # a process left waiting for the other would wait for hours
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
    main, other = results
    assert main["calls"] == 3 and other["calls"] == 0  # the rag agent asks once per question
    assert main["ids"] == other["ids"] and len(main["ids"]) == 3
    assert (main["failed"], other["failed"]) == ("ZeroDivisionError", "TrainingError")
    assert main["shared"] == other["shared"] == "main's"
    assert [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()] == [{"rank": "0"}]
