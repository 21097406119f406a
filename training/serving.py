"""Where the policy's rollouts and dev runs generate: `model.rollout_llm`, at `model.rollout_concurrency`
questions in flight (the eval runner's `concurrency`).

- `in_process` (the default): in the trainer's process, as `model.inference` says (llama.cpp over the pack's
  GGUF with the adapter written as a GGUF adapter, or transformers on the in-memory weights), one call at a
  time.
- `server[?threads=N&ctx=N&cache=MB]`: llama.cpp's own `llama-server` (models/server.py) on 127.0.0.1 over the
  policy pack's GGUF, with `rollout_concurrency` slots decoded together in one batch (the options as in a
  `llamacpp:` spec: threads, each slot's context, the prompt cache in RAM). Before each rollout or dev phase
  the adapters it serves are written as llama.cpp adapters (lora_gguf.py); when their contents differ from
  those the running server loaded, it is restarted with them (llama-server reads adapter files only when it
  starts: its `/lora-adapters` endpoint changes their scales, not their weights). Every call names its
  adapter in the request (`"lora": [{"id": i, "scale": 1.0}, ...]`, the others at 0), so MAPGRPO's role
  adapters and the base model share one server. Only a chat pack has a GGUF here: another policy needs
  `in_process` or `openai:` (NotServable).
- `openai:<url>#<model>`: a running OpenAI-compatible server, used as it is: every call asks for `<model>`.
  With `model.rollout_load_adapter`, before each phase each adapter is saved in PEFT form under the phase's
  folder and loaded through `<url>/load_lora_adapter` as `<model>-<adapter>` (`<model>-default` for MyGO and
  Omne, `<model>-plan` ... for MAPGRPO's roles), replacing the one loaded before under that name; calls then
  ask for it, and base-model calls for `<model>`. vLLM serves this with `--enable-lora`, a `--max-lora-rank`
  of at least `lora_r` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, reading the folder from the same disk.
- `vllm[?memory=F&ctx=N]`: the trainer starts that vLLM server itself (`VLLMServer`, on the main process's
  GPU; every process calls it): `vllm serve` over the policy's base model with LoRA enabled (a `--max-lora-rank` of at
  least `lora_r`, runtime adapter loading), `memory` its share of the GPU (`--gpu-memory-utilization`, 0.3 by
  default: the trainer keeps the rest) and `ctx` its context (`--max-model-len`; the model's own by default).
  Before each phase the adapters are saved and loaded into it as with `openai:` and `rollout_load_adapter`.
  A LoRA policy only: full fine-tuning would need the server's weights replaced every step (TRL's `use_vllm`).
  Through `openai:` and `vllm` the replies are not constrained by the agents' grammars (no grammar is sent).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from mhqa_graph.errors import InvalidInput, ModelError, ModelNotInstalled
from mhqa_graph.models.server import LlamaServer
from mhqa_graph.paths import file_sha256

from .devices import on_main_process, policy_device
from .lora_gguf import write_lora_gguf

IN_PROCESS, SERVER, OPENAI, VLLM = "in_process", "server", "openai:", "vllm"
LOAD_TIMEOUT_S = 600.0  # a load_lora_adapter request: the server reads the adapter from disk
VLLM_MEMORY = 0.3  # vLLM's default share of the GPU when the trainer starts it
VLLM_STARTUP_S = 1800.0  # vLLM loads the model, compiles and captures CUDA graphs before /health answers
VLLM_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM's --max-lora-rank accepts
VLLM_MAX_LORAS = 4  # adapters in one batch: MAPGRPO's three roles, and one to spare
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")  # a trainer's launch, not vLLM's


class NotServable(InvalidInput):
    """`model.rollout_llm: server` for a policy llama-server cannot serve: one that is not a chat pack (no
    GGUF file to serve) or not a LoRA adapter (no adapter file to put over it)."""


def check_rollout_llm(config: Any) -> None:
    """InvalidInput (NotServable for a policy `server` cannot serve) unless the model config's rollout
    settings can run. Cheap: starts, loads and converts nothing."""
    from mhqa_graph.models.factory import check_chat_spec
    from mhqa_graph.models.packs import PACKS

    llm = config.rollout_llm
    if not isinstance(llm, str) or not (llm == IN_PROCESS or llm.partition("?")[0] in (SERVER, VLLM)
                                        or llm.startswith(OPENAI)):
        raise InvalidInput(f"model.rollout_llm must be in_process, server[?threads=N&ctx=N&cache=MB], "
                           f"vllm[?memory=F&ctx=N] or openai:<url>#<model>, got {llm!r}")
    if isinstance(config.rollout_concurrency, bool) or not isinstance(config.rollout_concurrency, int) \
            or config.rollout_concurrency < 1:
        raise InvalidInput(f"model.rollout_concurrency must be a positive integer, got {config.rollout_concurrency!r}")
    if config.rollout_load_adapter and not llm.startswith(OPENAI):
        raise InvalidInput("model.rollout_load_adapter loads the adapter into an openai: server; "
                           f"rollout_llm is {llm!r}")
    if config.rollout_load_adapter and not config.lora:
        raise InvalidInput("model.rollout_load_adapter needs a LoRA policy (lora: true): there is no adapter "
                           "to load")
    if llm.startswith(OPENAI):
        check_chat_spec(llm)
    elif llm.partition("?")[0] == VLLM:
        vllm_options(llm)
        vllm_rank(config.lora_r)
        if not config.lora:
            raise NotServable("model.rollout_llm: vllm serves the base model with the LoRA adapter under training "
                              "loaded before each phase; a fully fine-tuned policy (lora: false) needs rollout_llm: "
                              "in_process (or TRL's use_vllm for MAPGRPO's completions)")
        vllm_binary()
    elif llm != IN_PROCESS:
        server_options(llm)
        packs = ", ".join(n for n, p in PACKS.items() if p.kind == "chat")
        if config.name not in PACKS or PACKS[config.name].kind != "chat":
            raise NotServable(f"model.rollout_llm: server runs llama-server over a chat pack's GGUF file "
                              f"({packs}); the policy {config.name!r} is not one. Use rollout_llm: in_process, or "
                              "openai:<url>#<model> with a server of your own (e.g. vLLM with --enable-lora)")
        if not config.lora:
            raise NotServable("model.rollout_llm: server puts the LoRA adapter under training over the pack's "
                              "GGUF; a fully fine-tuned policy (lora: false) needs rollout_llm: in_process or "
                              "openai:<url>#<model>")


def server_options(llm: str) -> dict[str, int]:
    """The LlamaServer settings of `server?threads=N&ctx=N&cache=MB` (ModelError for another option)."""
    from mhqa_graph.models.factory import _llamacpp_options

    query = llm.partition("?")[2]
    if {"slots", "lora"} & {key for key, _ in urllib.parse.parse_qsl(query, keep_blank_values=True)}:
        raise ModelError("model.rollout_llm: server sets its own slots (rollout_concurrency) and adapter (the one "
                         f"under training); its options are threads, ctx and cache, got {llm!r}")
    return _llamacpp_options(f"?{query}")[1]


def vllm_options(llm: str) -> dict[str, Any]:
    """`memory` and `ctx` of `vllm?memory=F&ctx=N` (InvalidInput for another option or a bad value)."""
    options = dict(urllib.parse.parse_qsl(llm.partition("?")[2], keep_blank_values=True))
    if unknown := sorted(set(options) - {"memory", "ctx"}):
        raise InvalidInput(f"model.rollout_llm: vllm's options are memory and ctx, got {', '.join(unknown)}")
    try:
        memory, ctx = float(options.get("memory", VLLM_MEMORY)), int(options.get("ctx", 0))
    except ValueError:
        raise InvalidInput(f"model.rollout_llm: vllm's memory is a fraction and ctx a number of tokens, got "
                           f"{llm!r}") from None
    if not 0 < memory < 1 or ctx < 0:
        raise InvalidInput(f"model.rollout_llm: vllm's memory is its share of the GPU, between 0 and 1 (the "
                           f"trainer keeps the rest), and ctx at least 0; got {llm!r}")
    return {"memory": memory, "ctx": ctx}


def vllm_rank(lora_r: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that holds an adapter of rank `lora_r`."""
    rank = next((r for r in VLLM_RANKS if r >= lora_r), None)
    if rank is None:
        raise InvalidInput(f"model.lora_r {lora_r} is above the largest LoRA rank vLLM serves ({VLLM_RANKS[-1]})")
    return rank


class VLLMServer(LlamaServer):
    """`vllm serve` over the policy's base model on 127.0.0.1, started by the trainer (`rollout_llm: vllm`), with
    LoRA adapters loaded at runtime (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`), `memory` of its GPU and the context
    `ctx` (0: the model's). `device` is the GPU it sees (`CUDA_VISIBLE_DEVICES`; None: this process's). The
    binary is `$MHQA_VLLM`, else `vllm` on the PATH. Its lifecycle is LlamaServer's: a free port, `/health`,
    a ModelError with the log's last lines when it cannot start."""

    program: ClassVar[str] = "vllm serve"

    def __init__(self, model: str, lora_rank: int, memory: float = VLLM_MEMORY, ctx: int = 0,
                 device: str | None = None, binary: str | None = None,
                 startup_timeout: float = VLLM_STARTUP_S) -> None:
        super().__init__(model, name="policy", binary=binary, startup_timeout=startup_timeout)
        self.lora_rank, self.memory, self.ctx, self.device = lora_rank, memory, ctx, device

    def _prepare(self) -> tuple[Path, Path]:
        return Path(self.binary or vllm_binary()), Path(self.model)

    def _args(self, prepared: tuple[Path, Path]) -> list[str]:
        binary, _ = prepared
        args = [str(binary), "serve", self.model, "--served-model-name", self.name, "--host", "127.0.0.1",
                "--port", str(self.port), "--enable-lora", "--max-lora-rank", str(self.lora_rank),
                "--max-loras", str(VLLM_MAX_LORAS), "--gpu-memory-utilization", str(self.memory)]
        return args + (["--max-model-len", str(self.ctx)] if self.ctx else [])

    def _env(self) -> dict[str, str]:
        """This process's environment without a distributed launch's variables (vLLM would read them as its
        own), with runtime LoRA loading on and the GPU it is to use."""
        env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if self.device is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.device
        return env

    def chat_model(self, **kwargs: Any) -> Any:
        """A chat model on this server (OpenAI-compatible; replies are not constrained by the agents' grammars)."""
        from mhqa_graph.models.factory import load_chat_model

        return load_chat_model(f"{OPENAI}{self.base_url}#{self.name}", **kwargs)


def vllm_server(config: Any) -> VLLMServer:
    """The running vLLM server of `config` (`rollout_llm: vllm...`), started when there is none."""
    from .policy import policy_source

    options, rank, gpu = vllm_options(config.rollout_llm), vllm_rank(config.lora_r), process_gpu()
    source = policy_source(config.name)[0]
    return POLICY_SERVER.serve((VLLM, source, rank, gpu, tuple(sorted(options.items()))),
                               lambda: VLLMServer(source, rank, device=gpu, **options))


def vllm_binary() -> str:
    """The `vllm` program: `$MHQA_VLLM`, else `vllm` on the PATH; ModelNotInstalled if there is none."""
    binary = os.environ.get("MHQA_VLLM") or shutil.which("vllm")
    if not binary or not Path(binary).is_file():
        raise ModelNotInstalled("model.rollout_llm: vllm runs `vllm serve`, which is not installed here: pip "
                                "install 'mhqa-graph[vllm]' on a CUDA machine, or set MHQA_VLLM to the binary")
    return binary


def process_gpu() -> str | None:
    """The GPU this process's policy is on, as `CUDA_VISIBLE_DEVICES` names it for a child process (None on the
    CPU)."""
    device = policy_device()
    if device.type != "cuda":
        return None
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    index = device.index or 0
    return visible[index] if index < len(visible) else str(index)


class PolicyServer:
    """The trainer's server (llama-server or vLLM), started on first use and started again whenever its key
    changes (one server at a time): for llama-server the pack, the slots and the adapters' contents, which it
    reads only when it starts; for vLLM the model and its settings (adapters are loaded into it)."""

    def __init__(self) -> None:
        self.server: Any = None
        self.key: tuple = ()

    def serve(self, key: tuple, make: Callable[[], LlamaServer]) -> Any:
        """The running server of `key`, made by `make()` and started when there is none."""
        if self.server is not None and self.server.alive and key == self.key:
            return self.server
        self.stop()
        server = make()
        server.start()
        self.server, self.key = server, key
        return server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server, self.key = None, ()


POLICY_SERVER = PolicyServer()  # one per process (under several, each process has its own)


def served_policy(model: Any, config: Any, folder: str | Path, adapters: Mapping[str, str | None],
                  temperature: float, max_new_tokens: int) -> dict[str, Any] | None:
    """{label: chat model} for `adapters` (label -> the policy's PEFT adapter, None: the base model) as
    `config.rollout_llm` serves them with the current weights (see the module docstring); None for
    `in_process`, which the caller serves itself. The adapter files go to `folder`."""
    if config.rollout_llm == IN_PROCESS:
        return None
    check_rollout_llm(config)
    names = sorted({a for a in adapters.values() if a is not None})
    kwargs = {"temperature": temperature, "max_new_tokens": max_new_tokens}
    kind = config.rollout_llm.partition("?")[0]
    if kind == SERVER:
        files = [Path(folder) / f"{name}.gguf" for name in names]
        on_main_process(lambda: [write_lora_gguf(model, f, n) for f, n in zip(files, names)])
        slots, options = config.rollout_concurrency, server_options(config.rollout_llm)
        key = (config.name, slots, tuple(file_sha256(f) for f in files), tuple(sorted(options.items())))
        server = POLICY_SERVER.serve(key, lambda: LlamaServer(config.name, slots=slots,
                                                              lora_path=[str(f) for f in files], **options))

        def scales(adapter: str | None) -> dict[str, Any]:
            lora = [{"id": i, "scale": float(name == adapter)} for i, name in enumerate(names)]
            return {"extra_body": {"lora": lora}} if lora else {}

        seed = {"seed": config.seed} if temperature > 0 else {}  # per call: seed + n (one seed would repeat)
        return {label: server.chat_model(**kwargs, **seed, **scales(a)) for label, a in adapters.items()}
    from mhqa_graph.models.factory import load_chat_model

    root = Path(folder).resolve() / "peft"
    if kind == VLLM:  # one server, the main process's, on its GPU: it saves and loads the adapters, all call it
        def start_and_load() -> tuple[str, str]:
            server = vllm_server(config)
            load_adapters(server.base_url, server.name, save_adapters(model, names, root), root)
            return server.base_url, server.name

        base_url, served = on_main_process(start_and_load, share=True)
    else:
        base_url, _, served = config.rollout_llm[len(OPENAI):].partition("#")
        if not config.rollout_load_adapter:
            return {label: load_chat_model(config.rollout_llm, **kwargs) for label in adapters}
        on_main_process(lambda: load_adapters(base_url, served, save_adapters(model, names, root), root))
    return {label: load_chat_model(f"{OPENAI}{base_url}#{served}" + (f"-{a}" if a else ""), **kwargs)
            for label, a in adapters.items()}


def save_adapters(model: Any, names: list[str], root: Path) -> list[str]:
    """Save each adapter of `names` under `root` in PEFT's layout ("default" at the root, another in its own
    folder); returns `names`."""
    model.save_pretrained(str(root), selected_adapters=names)
    return names


def load_adapters(base_url: str, served: str, names: list[str], root: Path) -> None:
    """Load each adapter of `names`, saved under `root` by `save_adapters`, into the server at `base_url` as
    `<served>-<adapter>`."""
    for name in names:
        load_lora_adapter(base_url, f"{served}-{name}", root if name == "default" else root / name)


def _post(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=LOAD_TIMEOUT_S):
        pass


def _refusal(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read().decode("utf-8", "replace")[:500]
    except OSError:
        return ""


def load_lora_adapter(base_url: str, name: str, path: Path) -> None:
    """Load the PEFT adapter folder `path` into the OpenAI-compatible server at `base_url` as `name` (vLLM's
    `POST /v1/load_lora_adapter`), in place of one already loaded under that name: `load_inplace`, or, for a
    server that refuses it, unloaded first. ModelError saying what the server answered when it can't."""
    url = base_url.rstrip("/")
    body = {"lora_name": name, "lora_path": str(path)}
    try:
        try:
            _post(f"{url}/load_lora_adapter", body | {"load_inplace": True})
            return
        except urllib.error.HTTPError as exc:
            said = _refusal(exc)
            if exc.code == 404:
                raise ModelError(f"{url} has no /load_lora_adapter (HTTP 404): vLLM enables it with --enable-lora "
                                 "and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; or set model.rollout_load_adapter: "
                                 "false and load the adapter yourself") from None
            if "already" not in said.lower():
                raise ModelError(f"{url} refused to load the adapter {name!r} from {path} (HTTP {exc.code}): "
                                 f"{said}") from None
        _post(f"{url}/unload_lora_adapter", {"lora_name": name})  # loaded, and no load_inplace: unload first
        _post(f"{url}/load_lora_adapter", body)
    except urllib.error.HTTPError as exc:
        raise ModelError(f"{url} refused to reload the adapter {name!r} from {path} (HTTP {exc.code}): "
                         f"{_refusal(exc)}") from None
    except urllib.error.URLError as exc:
        raise ModelError(f"cannot reach {url} to load the adapter {name!r}: {exc.reason}") from None
