"""Rollouts and dev runs through an OpenAI-compatible server with the adapter under training
(training/serving.py): a real llama-server on loopback over the smollm2-135m pack with a PEFT LoRA on its
transformers form, exported as a llama.cpp adapter before each phase; the server started again when the
adapter changes, K questions decoded at once, the same server reached as `openai:`, the typed error for a
policy `server` cannot serve, and vLLM's adapter loading against a stand-in HTTP server, and the vLLM server
the trainer starts itself (a stand-in `vllm` program). The real-server
tests skip only when the llama-server binary is not built (see tests/test_llama_server.py)."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("peft")
torch = pytest.importorskip("torch")

from mhqa_graph.training.configs import ModelConfig, RolloutConfig, load_config  # noqa: E402
from mhqa_graph.training.mygo import MyGOConfig  # noqa: E402
from mhqa_graph.training.policy import load_model, policy_chat_model, policy_source  # noqa: E402
from mhqa_graph.training.rollouts import rollouts  # noqa: E402
from mhqa_graph.training.serving import POLICY_SERVER, NotServable, load_lora_adapter, served_policy  # noqa: E402
from test_eval import write_dataset  # noqa: E402
from test_llama_server import _gone, real  # noqa: E402

from mhqa_graph.errors import InvalidInput, ModelError, ModelNotInstalled  # noqa: E402
from mhqa_graph.export import OPERA_ROLES  # noqa: E402
from mhqa_graph.models import server as srv  # noqa: E402

PROMPT = "Say something."
QUESTIONS = {f"q{i}": (f"Which city is the capital of country {i}?", f"City {i}", "bridge", None) for i in range(4)}


@pytest.fixture(scope="module")
def policy():
    """smollm2-135m with a fresh LoRA adapter (B = 0), served by llama-server with 2 slots (one thread: the
    tests share the cores with other work, and llama.cpp's threads wait for each other)."""
    config = ModelConfig(name="smollm2-135m", lora_r=4, lora_alpha=8, rollout_llm="server?threads=1&ctx=2048",
                         rollout_concurrency=2)
    model, tokenizer = load_model(config)
    yield model, tokenizer, config
    pids = [s.pid for s in list(srv._live)]
    POLICY_SERVER.stop()
    srv.stop_all()
    assert all(_gone(pid) for pid in pids if pid)


def reply(llm) -> str:
    return llm.invoke(PROMPT).text


@real
def test_the_server_serves_the_adapter_under_training_and_a_new_one_after_it_changes(policy, tmp_path):
    model, _, config = policy
    adapters = {"policy": "default", "base": None}
    first = served_policy(model, config, tmp_path / "iter1", adapters, 0.0, 12)
    server, pid = first["policy"]._server, first["policy"]._server.pid
    assert server is first["base"]._server and (server.slots, server.n_threads, server.n_ctx) == (2, 1, 2048)
    assert server.lora_paths == [str(tmp_path / "iter1" / "default.gguf")]
    base = reply(first["base"])
    assert base and reply(first["policy"]) == base  # a fresh adapter (B = 0) leaves the base model's output
    same = served_policy(model, config, tmp_path / "dev1", adapters, 0.0, 12)
    assert same["policy"]._server is server  # the same weights: no restart
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a training step's worth of change, and then some
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.25)
    second = served_policy(model, config, tmp_path / "iter2", adapters, 0.0, 12)
    assert second["policy"]._server is not server and not server.alive and _gone(pid)
    trained = reply(second["policy"])
    # the same server as a user's `openai:` one, used as it is (its adapter at the scale it was started with),
    # its prompt computed afresh as `trained`'s was: one read from a slot's cache differs in the last bits, which
    # flips this random adapter's first token on some CPUs, and llama-server reuses a cached prompt for a request
    # naming no adapters, whichever adapters computed it (served_policy's calls always name theirs)
    as_openai = ModelConfig(name="smollm2-135m", rollout_llm=second["policy"]._server.spec)
    outside = policy_chat_model(model, None, as_openai, tmp_path / "openai", 0.0, 4)
    fresh = outside.invoke(PROMPT, extra_body={"cache_prompt": False}).text
    assert type(outside).__name__ == "ChatOpenAI" and trained.startswith(fresh)
    assert reply(second["base"]) == base and trained != base  # each call picks its adapter
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.zero_()


@real
def test_a_rollout_keeps_k_questions_in_flight_on_the_servers_slots(policy, tmp_path):
    model, tokenizer, config = policy
    folder = tmp_path / "iter1" / "rollouts"
    llm = policy_chat_model(model, tokenizer, config, folder, 0.7, 16)
    slots_url = llm._server.base_url.removesuffix("/v1") + "/slots"
    busy, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            with urllib.request.urlopen(slots_url, timeout=5) as answer:
                busy.append(sum(bool(s.get("is_processing")) for s in json.load(answer)))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    rollout = RolloutConfig(agent="rag", dataset="hotpotqa", path=str(write_dataset(tmp_path / "q.jsonl", QUESTIONS)),
                            store=f"embedded://{tmp_path}/s?embedder=hash", limit=4, max_new_tokens=16)
    try:
        records = rollouts(rollout, llm, folder, concurrency=2)
    finally:
        done.set()
        watcher.join(10)
    assert len(records) == 4 and not any(r["failed"] for r in records)
    assert all(r["llm_calls"] and r["trace"]["llm_calls"][0]["output"] for r in records)
    assert max(busy) == 2  # two calls decoded together
    manifest = json.loads((folder / "sample0" / "run.json").read_text(encoding="utf-8"))
    assert manifest["llm"] == "LlamaServerChatModel"


@real
def test_mapgrpos_role_adapters_share_one_server_each_call_naming_its_own(policy, tmp_path):
    pytest.importorskip("trl")
    from mhqa_graph.training.mapgrpo import MAPGRPOConfig, MAPGRPOTrainer

    model_config = dataclasses.replace(policy[2], lora_r=2)
    trainer = MAPGRPOTrainer(MAPGRPOConfig(model=model_config, output_dir=str(tmp_path)))
    base, roles = trainer.role_models(0.7, tmp_path / "plan" / "rollouts")
    server = base._server
    assert roles["answer"] is base and all(m._server is server for m in roles.values())
    adapters = sorted(OPERA_ROLES)
    assert server.lora_paths == [str(tmp_path / "plan" / "rollouts" / f"{a}.gguf") for a in adapters]
    for role in (*OPERA_ROLES, "answer"):
        scales = [{"id": i, "scale": float(a == role)} for i, a in enumerate(adapters)]
        assert roles[role].extra_body == {"lora": scales}
    assert roles["analysis"].invoke(PROMPT, max_new_tokens=2).text


def test_server_needs_a_chat_pack_policy_with_a_lora_adapter(tmp_path):
    with pytest.raises(NotServable, match="'tiny' is not one. Use rollout_llm: in_process, or openai:"):
        ModelConfig(name="tiny", rollout_llm="server")
    with pytest.raises(NotServable, match="is not one"):
        ModelConfig(name=str(tmp_path), rollout_llm="server")  # a transformers folder: no GGUF to serve
    with pytest.raises(NotServable, match=r"\(lora: false\) needs rollout_llm: in_process or openai:"):
        ModelConfig(name="smollm2-135m", lora=False, rollout_llm="server")
    yaml = tmp_path / "mygo.yaml"
    yaml.write_text("model: {name: tiny, rollout_llm: server, rollout_concurrency: 4}\n", encoding="utf-8")
    with pytest.raises(NotServable):  # when the config is read, before any model loads
        load_config(MyGOConfig, yaml)
    with pytest.raises(InvalidInput, match="in_process, server.* or openai:<url>#<model>"):
        ModelConfig(rollout_llm="sglang")
    with pytest.raises(ModelError, match="sets its own slots"):
        ModelConfig(name="smollm2-135m", rollout_llm="server?slots=4")
    for adapter in ("omne-pq2h", str(tmp_path / "absent.gguf")):  # a shipped name or a file: said as plainly
        with pytest.raises(ModelError, match="adapter \\(the one under training\\)"):
            ModelConfig(name="smollm2-135m", rollout_llm=f"server?lora={adapter}")
    with pytest.raises(InvalidInput, match="rollout_concurrency must be a positive integer"):
        ModelConfig(rollout_concurrency=0)
    with pytest.raises(ModelError, match="base url and a model"):
        ModelConfig(rollout_llm="openai:http://127.0.0.1:9/v1")
    with pytest.raises(InvalidInput, match="rollout_load_adapter loads the adapter into an openai: server"):
        ModelConfig(rollout_llm="server", name="smollm2-135m", rollout_load_adapter=True)


class LoraEndpoints(BaseHTTPRequestHandler):
    """vLLM's adapter endpoints as a stand-in: records each request; `refuse` scripts the next answers."""

    seen: list[tuple[str, dict]] = []
    refuse: list[tuple[int, str]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, body))
        code, text = self.refuse.pop(0) if self.refuse else (200, "Success")
        self.send_response(code)
        self.end_headers()
        self.wfile.write(text.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def lora_endpoints():
    LoraEndpoints.seen, LoraEndpoints.refuse = [], []
    http = ThreadingHTTPServer(("127.0.0.1", 0), LoraEndpoints)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{http.server_port}/v1", LoraEndpoints
    http.shutdown()
    http.server_close()


def test_openai_with_load_adapter_saves_each_adapter_and_loads_it_under_its_name(lora_endpoints, tmp_path):
    url, endpoints = lora_endpoints
    config = ModelConfig(name="tiny", lora_r=4, rollout_llm=f"openai:{url}#policy", rollout_load_adapter=True,
                         rollout_concurrency=8)
    model, tokenizer = load_model(config)
    model.add_adapter("plan", model.peft_config["default"])
    served = served_policy(model, config, tmp_path / "iter1", {"plan": "plan", "analysis": "default", "answer": None},
                           0.7, 32)
    assert {k: (m.model_name, m.temperature, m.max_tokens) for k, m in served.items()} == {
        "plan": ("policy-plan", 0.7, 32), "analysis": ("policy-default", 0.7, 32), "answer": ("policy", 0.7, 32)}
    root = (tmp_path / "iter1" / "peft").resolve()
    assert endpoints.seen == [
        ("/v1/load_lora_adapter", {"lora_name": "policy-default", "lora_path": str(root), "load_inplace": True}),
        ("/v1/load_lora_adapter", {"lora_name": "policy-plan", "lora_path": str(root / "plan"), "load_inplace": True})]
    assert all((Path(body["lora_path"]) / "adapter_config.json").is_file() for _, body in endpoints.seen)
    llm = policy_chat_model(model, tokenizer, config, tmp_path / "iter2", 0.0, 16)
    assert llm.model_name == "policy-default" and endpoints.seen[-1][1]["lora_path"] == str(
        (tmp_path / "iter2" / "peft").resolve())


def test_a_server_without_load_inplace_reloads_and_one_without_the_endpoint_says_how(lora_endpoints, tmp_path):
    url, endpoints = lora_endpoints
    endpoints.refuse = [(400, '{"message": "The lora adapter policy-default has already been loaded."}')]
    load_lora_adapter(url, "policy-default", tmp_path)
    assert [(path, body.get("load_inplace")) for path, body in endpoints.seen] == [
        ("/v1/load_lora_adapter", True), ("/v1/unload_lora_adapter", None), ("/v1/load_lora_adapter", None)]
    endpoints.refuse = [(404, "Not Found")]
    with pytest.raises(ModelError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
        load_lora_adapter(url, "policy-default", tmp_path)
    endpoints.refuse = [(400, '{"message": "max_lora_rank 8 < 16"}')]
    with pytest.raises(ModelError, match="refused to load the adapter 'policy-default'.*max_lora_rank"):
        load_lora_adapter(url, "policy-default", tmp_path)


STAND_IN_VLLM = """#!{python}
import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args, record = sys.argv[1:], os.environ["STAND_IN_RECORD"]

def note(entry):
    with open(record, "a") as f:
        f.write(json.dumps(entry) + "\\n")

note({{"args": args, "updating": os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
       "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}})
if os.environ.get("STAND_IN_FAIL"):
    print("ValueError: Free memory on device is less than the desired GPU memory utilization", flush=True)
    sys.exit(1)

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def do_POST(self):
        note({{"path": self.path, "body": json.loads(self.rfile.read(int(self.headers["Content-Length"])))}})
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"Success")

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
"""


@pytest.fixture
def stand_in_vllm(tmp_path, monkeypatch):
    """A `vllm` program that notes its command line and environment and answers /health and the adapter
    endpoints; the notes are returned."""
    program = tmp_path / "vllm"
    program.write_text(STAND_IN_VLLM.format(python=sys.executable), encoding="utf-8")
    program.chmod(0o755)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("MHQA_VLLM", str(program))
    monkeypatch.setenv("STAND_IN_RECORD", str(record))
    yield lambda: [json.loads(line) for line in record.read_text().splitlines()]
    POLICY_SERVER.stop()


def test_the_trainer_starts_vllm_with_its_share_of_the_gpu_and_loads_the_adapter_each_phase(stand_in_vllm,
                                                                                          tmp_path):
    config = ModelConfig(name="tiny", lora_r=12, rollout_llm="vllm?memory=0.25&ctx=4096", rollout_concurrency=16)
    model, _ = load_model(config)
    adapters = {"policy": "default", "answer": None}
    first = served_policy(model, config, tmp_path / "iter1", adapters, 0.7, 32)
    second = served_policy(model, config, tmp_path / "iter2", adapters, 0.0, 32)
    notes = stand_in_vllm()
    starts = [n for n in notes if "args" in n]
    assert len(starts) == 1  # one server for both phases: the adapter is loaded into it, not restarted
    args = starts[0]["args"]
    value = {flag: args[i + 1] for i, flag in enumerate(args[:-1]) if flag.startswith("--")}
    assert args[:2] == ["serve", policy_source("tiny")[0]] and "--enable-lora" in args
    assert (value["--max-lora-rank"], value["--gpu-memory-utilization"], value["--max-model-len"],
            value["--served-model-name"], value["--host"]) == ("16", "0.25", "4096", "policy", "127.0.0.1")
    assert starts[0]["updating"] == "True"
    loads = [(n["path"], n["body"]["lora_name"], n["body"]["lora_path"]) for n in notes if "path" in n]
    assert loads == [("/v1/load_lora_adapter", "policy-default", str((tmp_path / phase / "peft").resolve()))
                     for phase in ("iter1", "iter2")]
    assert (tmp_path / "iter2" / "peft" / "adapter_config.json").is_file()
    url = f"http://127.0.0.1:{value['--port']}/v1"
    for served in (first, second):
        assert {k: (m.model_name, m.openai_api_base) for k, m in served.items()} == {
            "policy": ("policy-default", url), "answer": ("policy", url)}


def test_vllm_that_cannot_start_or_serve_says_why(stand_in_vllm, tmp_path, monkeypatch):
    config = ModelConfig(name="tiny", rollout_llm="vllm")
    model, _ = load_model(config)
    monkeypatch.setenv("STAND_IN_FAIL", "1")
    with pytest.raises(ModelError, match="(?s)vllm serve exited while starting.*less than the desired GPU memory"):
        served_policy(model, config, tmp_path / "iter1", {"policy": "default"}, 0.0, 8)
    monkeypatch.setenv("MHQA_VLLM", str(tmp_path / "nowhere"))
    with pytest.raises(ModelNotInstalled, match=r"pip install 'mhqa-graph\[vllm\]'"):
        served_policy(model, config, tmp_path / "iter1", {"policy": "default"}, 0.0, 8)
    with pytest.raises(NotServable, match="lora: false"):
        ModelConfig(name="tiny", lora=False, rollout_llm="vllm")
    for bad in ("vllm?memory=1.5", "vllm?memory=half", "vllm?slots=4"):
        with pytest.raises(InvalidInput, match="vllm's"):
            ModelConfig(name="tiny", rollout_llm=bad)
    with pytest.raises(InvalidInput, match="largest LoRA rank vLLM serves"):
        ModelConfig(name="tiny", lora_r=1024, rollout_llm="vllm")


def test_vllm_runs_on_the_process_gpu_without_the_trainers_launch_variables(monkeypatch):
    from mhqa_graph.training import serving

    monkeypatch.setattr(serving, "policy_device", lambda: torch.device("cuda", 1))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert serving.process_gpu() == "6"  # the second GPU this process sees is the machine's GPU 6
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert serving.process_gpu() == "1"
    monkeypatch.setattr(serving, "policy_device", lambda: torch.device("cpu"))
    assert serving.process_gpu() is None
    for name, value in (("RANK", "1"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    env = serving.VLLMServer("policy-folder", 16, device="6")._env()
    assert env["CUDA_VISIBLE_DEVICES"] == "6" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"} & set(env) and env["PATH"]
