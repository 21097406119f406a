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
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mhqa_graph.errors import InvalidInput, ModelError

from .devices import on_main_process
from .lora_gguf import write_lora_gguf

IN_PROCESS, SERVER, OPENAI = "in_process", "server", "openai:"
LOAD_TIMEOUT_S = 600.0  # a load_lora_adapter request: the server reads the adapter from disk


class NotServable(InvalidInput):
    """`model.rollout_llm: server` for a policy llama-server cannot serve: one that is not a chat pack (no
    GGUF file to serve) or not a LoRA adapter (no adapter file to put over it)."""


def check_rollout_llm(config: Any) -> None:
    """InvalidInput (NotServable for a policy `server` cannot serve) unless the model config's rollout
    settings can run. Cheap: starts, loads and converts nothing."""
    from mhqa_graph.models.factory import check_chat_spec
    from mhqa_graph.models.packs import PACKS

    llm = config.rollout_llm
    if not isinstance(llm, str) or not (llm == IN_PROCESS or llm.partition("?")[0] == SERVER
                                        or llm.startswith(OPENAI)):
        raise InvalidInput(f"model.rollout_llm must be in_process, server[?threads=N&ctx=N&cache=MB] or "
                           f"openai:<url>#<model>, got {llm!r}")
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

    options = _llamacpp_options(f"?{llm.partition('?')[2]}")[1]
    if {"slots", "lora_path"} & set(options):
        raise ModelError("model.rollout_llm: server sets its own slots (rollout_concurrency) and adapter; its "
                         f"options are threads, ctx and cache, got {llm!r}")
    return options


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class PolicyServer:
    """The trainer's llama-server: a pack's GGUF with the policy's adapter files, started on first use and
    started again whenever the pack, the slots or the adapters' contents change (one server at a time)."""

    def __init__(self) -> None:
        self.server: Any = None
        self.key: tuple = ()

    def serve(self, pack: str, slots: int, files: list[Path], **options: int) -> Any:
        """The running server of `pack` with `slots` slots, the adapter `files` (ids 0, 1, ... in order) and
        the other LlamaServer `options`."""
        from mhqa_graph.models.server import LlamaServer

        key = (pack, slots, tuple(file_digest(f) for f in files), tuple(sorted(options.items())))
        if self.server is not None and self.server.alive and key == self.key:
            return self.server
        self.stop()
        server = LlamaServer(pack, slots=slots, lora_path=[str(f) for f in files], **options)
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
    if not config.rollout_llm.startswith(OPENAI):
        files = [Path(folder) / f"{name}.gguf" for name in names]
        on_main_process(lambda: [write_lora_gguf(model, f, n) for f, n in zip(files, names)])
        server = POLICY_SERVER.serve(config.name, config.rollout_concurrency, files,
                                     **server_options(config.rollout_llm))

        def scales(adapter: str | None) -> dict[str, Any]:
            lora = [{"id": i, "scale": float(name == adapter)} for i, name in enumerate(names)]
            return {"extra_body": {"lora": lora}} if lora else {}

        seed = {"seed": config.seed} if temperature > 0 else {}  # per call: seed + n (one seed would repeat)
        return {label: server.chat_model(**kwargs, **seed, **scales(a)) for label, a in adapters.items()}
    from mhqa_graph.models.factory import load_chat_model

    base_url, _, served = config.rollout_llm[len(OPENAI):].partition("#")
    if not config.rollout_load_adapter:
        return {label: load_chat_model(config.rollout_llm, **kwargs) for label in adapters}
    root = Path(folder).resolve() / "peft"
    on_main_process(lambda: load_adapters(model, base_url, served, names, root))
    return {label: load_chat_model(f"{OPENAI}{base_url}#{served}-{a}" if a else config.rollout_llm, **kwargs)
            for label, a in adapters.items()}


def load_adapters(model: Any, base_url: str, served: str, names: list[str], root: Path) -> None:
    """Save each adapter of `names` under `root` (PEFT's layout: "default" at the root, another in its own
    folder) and load it into the server at `base_url` as `<served>-<adapter>`."""
    model.save_pretrained(str(root), selected_adapters=names)
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
