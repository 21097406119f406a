"""llama.cpp's own server (`llama-server`) as a local backend that decodes several calls at once.

An in-process `llamacpp:` model serves one call at a time. `llama-server` keeps `slots` sequences, each
with its own context window and prompt cache, and decodes the calls in flight together in one batch
(continuous batching), so Mujica's parallel workers, OPERA's independent sub-goals and `mhqa eval
--concurrency K` overlap. `LlamaServer` runs one on 127.0.0.1 (a free port) for a pack name or a .gguf file;
the spec `llamacpp:<pack or .gguf>?slots=N` starts one shared server per distinct settings in the process
(stopped at exit) and returns a `LlamaServerChatModel`, a `ChatOpenAI` pointed at it that is constrained by
the same GBNF grammars as the in-process model (`grammar` goes to the server in the request body) and
reports the prompt tokens its cache saved as `usage_metadata["input_token_details"]["cache_read"]`.

The binary is built once from the llama.cpp sources that llama-cpp-python vendors (`scripts/llama_server.sh`,
which `scripts/install.sh` runs with the `openai` and `llamacpp` extras) into the user cache;
`$MHQA_LLAMA_SERVER` names another one.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.language_models import BaseChatModel
from langchain_core.outputs import ChatResult
from pydantic import PrivateAttr

from ..errors import ModelError, ModelNotInstalled
from ..paths import expand_user_path, file_sha256
from .call_cache import model_key
from .chat import call_seed
from .llamacpp import DEFAULT_CACHE_MB, DEFAULT_CTX, usable_cores
from .packs import PACKS, gguf_path

try:
    from langchain_openai import ChatOpenAI
except ImportError:  # the openai extra is missing: LlamaServer.chat_model says so
    ChatOpenAI = None

LLAMA_CPP_VERSION = "0.3.36"  # the llama-cpp-python release whose vendored llama.cpp scripts/llama_server.sh builds
INSTALL_HINT = ("build it with `bash scripts/llama_server.sh` (about 10 minutes; scripts/install.sh does so with "
                "the openai and llamacpp extras) or set MHQA_LLAMA_SERVER to a llama-server binary")
STARTUP_TIMEOUT_S = 180.0  # loading a model; a 1.5B Q4 pack takes seconds
STOP_TIMEOUT_S = 10.0  # after SIGTERM, before SIGKILL
REQUEST_TIMEOUT_S = 900.0  # per call: several long prompts share 2 cores
LOG_LINES = 15  # of the server's log in an error


class LlamaServerNotInstalled(ModelNotInstalled):
    """No llama-server binary was found; the message says how to build one."""


class LlamaServerError(ModelError):
    """llama-server failed to start, or exited while in use; `log` holds its last lines."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(f"{message}\n{log}" if log else message)
        self.log = log


def built_binary() -> Path:
    """Where scripts/llama_server.sh puts the binary: the user cache, by llama-cpp-python version."""
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("mhqa-graph")) / "llama-server" / LLAMA_CPP_VERSION / "llama-server"


def find_binary() -> Path:
    """The llama-server to run: $MHQA_LLAMA_SERVER, else the one scripts/llama_server.sh built, else one on
    PATH; LlamaServerNotInstalled with the install hint if none is there. Cheap: runs nothing."""
    named = os.environ.get("MHQA_LLAMA_SERVER")
    if named:
        path = expand_user_path(named, LlamaServerNotInstalled)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LlamaServerNotInstalled(f"MHQA_LLAMA_SERVER={named!r} is not an executable file; {INSTALL_HINT}")
        return path
    built = built_binary()
    if built.is_file() and os.access(built, os.X_OK):
        return built
    import shutil

    found = shutil.which("llama-server")
    if found:
        return Path(found)
    raise LlamaServerNotInstalled(f"llamacpp: ?slots=N needs llama.cpp's llama-server, not found at {built} "
                                  f"or on PATH; {INSTALL_HINT}")


# The server dies with the thread that started it (PR_SET_PDEATHSIG), so it is started from one thread that
# lives as long as the process: a killed Python process leaves no server behind.
_spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mhqa-llama-server")
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None) if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: nothing is left to save once its process is gone


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """`sig` to the server's process group (it leads its own session), so its children get it too."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):  # the group is gone
        pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_live: set[LlamaServer] = set()  # started and not stopped: held here, so that none is lost before stop_all


class LlamaServer:
    """`llama-server` for one GGUF model on 127.0.0.1, as a context manager (or `start()` / `stop()`).

    `model`: a chat pack name (its GGUF is assembled once, `packs.gguf_path`) or a .gguf file. `slots`:
    sequences decoded together; `n_ctx`: tokens of each slot's window (0 = 8192, as in-process);
    `n_threads`: 0 = every usable core; `lora_path`: LoRA adapter .gguf file(s) applied to every call;
    `prompt_cache_mb`: the server's RAM cache of prompt states beyond what the slots hold (0 = off; each slot
    still reuses the prefix of its previous call). `start()` waits for `/health`; a server that cannot start,
    or has died when asked, raises LlamaServerError with the last lines of its log."""

    program: ClassVar[str] = "llama-server"  # in messages

    def __init__(self, model: str | Path, slots: int = 1, n_ctx: int = 0, n_threads: int = 0,
                 lora_path: str | Sequence[str] = (), prompt_cache_mb: int = DEFAULT_CACHE_MB,
                 name: str = "", binary: str | Path | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT_S) -> None:
        if slots < 1:
            raise ModelError(f"llama-server needs at least one slot, got {slots}")
        self.model, self.name = str(model), name or (str(model) if str(model) in PACKS else Path(model).stem)
        self.slots, self.n_ctx = slots, n_ctx or DEFAULT_CTX
        self.n_threads, self.prompt_cache_mb = n_threads or usable_cores(), prompt_cache_mb
        self.lora_paths = [lora_path] if isinstance(lora_path, str) and lora_path else list(lora_path or ())
        self.binary, self.startup_timeout = binary, startup_timeout
        self.port = 0
        self._proc: subprocess.Popen | None = None
        self._log_path: Path | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LlamaServer:
        """Start the server and wait until it answers `/health`; returns self. Idempotent."""
        if self.alive:
            return self
        args = self._prepare()
        for attempt in range(3):  # another process may take the free port before the server binds it
            self.port = _free_port()
            self._spawn(self._args(args), self._env())
            try:
                self._wait_ready()
                return self
            except LlamaServerError as exc:
                self.stop()
                if attempt == 2 or "bind" not in exc.log.lower():
                    raise
        return self

    def _prepare(self) -> tuple[Path, Path]:
        """What every start needs, checked: the binary and the GGUF file."""
        binary = Path(self.binary) if self.binary else find_binary()
        if not binary.is_file():
            raise LlamaServerNotInstalled(f"no llama-server at {binary}; {INSTALL_HINT}")
        gguf = gguf_path(self.model) if self.model in PACKS else expand_user_path(self.model, ModelError)
        if not gguf.is_file():
            raise ModelError(f"llama-server: no GGUF file at {str(gguf)!r}")
        for path in self.lora_paths:
            if not Path(path).is_file():
                raise ModelError(f"llama-server: no LoRA adapter file at {path!r}")
        return binary, gguf

    def _args(self, prepared: tuple[Path, Path]) -> list[str]:
        binary, gguf = prepared
        args = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
                "--alias", self.name, "-np", str(self.slots), "-c", str(self.n_ctx * self.slots),
                "-t", str(self.n_threads), "-tb", str(self.n_threads), "--cache-ram", str(self.prompt_cache_mb),
                "--jinja", "--reasoning-format", "none", "--no-webui"]  # a reply's <think> stays in its text
        for path in self.lora_paths:
            args += ["--lora", str(path)]
        return args

    def _env(self) -> dict[str, str] | None:
        """The server's environment (None: this process's)."""
        return None

    def _spawn(self, args: list[str], env: dict[str, str] | None) -> None:
        fd, log = tempfile.mkstemp(prefix=f"mhqa-{self.program.split()[0]}-", suffix=".log")
        self._log_path = Path(log)
        try:
            self._proc = _spawner.submit(subprocess.Popen, args, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                                         env=env, start_new_session=True, preexec_fn=_die_with_parent).result()
        except OSError as exc:
            raise LlamaServerError(f"cannot run {args[0]}: {exc}") from exc
        finally:
            os.close(fd)
        _live.add(self)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise LlamaServerError(f"{self.program} exited while starting ({self._status()})", self.log_tail())
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):  # not listening yet, or 503 while it loads the model
                pass
            time.sleep(0.1)
        raise LlamaServerError(f"{self.program} did not answer /health within {self.startup_timeout:.0f} s",
                               self.log_tail())

    def stop(self) -> None:
        """SIGTERM to its process group, then SIGKILL after STOP_TIMEOUT_S; removes its log. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait()
            _signal_group(proc, signal.SIGKILL)  # what the server started and left behind (vLLM's engine)
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None
        _live.discard(self)

    # -- state ---------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def spec(self) -> str:
        """The `openai:` spec of the running server, for another process or tool."""
        return f"openai:{self.base_url}#{self.name}"

    def _status(self) -> str:
        code = self._proc.poll() if self._proc is not None else None
        if code is None:
            return "stopped"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    def log_tail(self, lines: int = LOG_LINES) -> str:
        """The last lines of the server's log (its stdout and stderr)."""
        if self._log_path is None or not self._log_path.is_file():
            return ""
        with self._log_path.open(encoding="utf-8", errors="replace") as log:
            return "".join(deque(log, maxlen=lines)).rstrip()

    def check(self) -> None:
        """LlamaServerError with the log's last lines if the server is not running."""
        if not self.alive:
            raise LlamaServerError(f"{self.program} for {self.name} is not running ({self._status()})",
                                   self.log_tail())

    def chat_model(self, **kwargs: Any) -> LlamaServerChatModel:
        """A chat model on this server; kwargs as for the local models (max_new_tokens, temperature, stop)."""
        if ChatOpenAI is None:
            raise ModelNotInstalled("llamacpp: ?slots=N talks to llama-server through langchain-openai; "
                                    "pip install 'mhqa-graph[openai]'")
        self.check()
        kwargs.pop("model_name", None)  # the server's alias names the model
        if "max_new_tokens" in kwargs:
            kwargs["max_tokens"] = kwargs.pop("max_new_tokens")
        kwargs.setdefault("temperature", 0.0)  # greedy, as the local models
        kwargs.setdefault("timeout", REQUEST_TIMEOUT_S)
        kwargs.setdefault("max_retries", 0)  # get_llm retries transient failures itself, with backoff
        model = LlamaServerChatModel(base_url=self.base_url, model=self.name, api_key="EMPTY", **kwargs)
        model._server = self
        return model


_shared: dict[tuple, LlamaServer] = {}
_shared_lock = threading.Lock()


def shared_server(model: str | Path, **settings: Any) -> LlamaServer:
    """The running server for `model` with these LlamaServer settings, started on first use (and again if it
    died); one per distinct settings in the process, stopped at exit. Two models or two adapters never share
    one, nor its cached states."""
    key = (str(model), tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in settings.items())))
    with _shared_lock:
        server = _shared.get(key)
        if server is None or not server.alive:
            if server is not None:
                server.stop()
            server = _shared[key] = LlamaServer(model, **settings)
            try:
                server.start()
            except BaseException:
                del _shared[key]
                raise
        return server


def stop_all() -> None:
    """Stop every server this process started and has not stopped (the shared ones too)."""
    with _shared_lock:
        _shared.clear()
    for server in list(_live):
        server.stop()


atexit.register(stop_all)


class LlamaServerChatModel(ChatOpenAI or BaseChatModel):  # type: ignore[misc]
    """`ChatOpenAI` on a `LlamaServer`, playing the in-process llama.cpp model: `grammar=<GBNF text>`
    constrains a call (sent as the request's `grammar`; a grammar the server refuses falls back to the prompt
    and says so in `response_metadata`), `max_new_tokens` is accepted, tool calls use the text protocol
    (no native `bind_tools`: the server refuses a grammar beside tools), `cache_read` is always reported, and
    a server that died raises LlamaServerError with its log. Unlike in-process, a prompt longer than a slot's
    window is refused (HTTP 400), not cut: give the spec a larger `ctx`."""

    accepts_grammar: ClassVar[bool] = True
    bind_tools = BaseChatModel.bind_tools  # type: ignore[assignment]
    _server: Any = PrivateAttr(default=None)
    _calls: Any = PrivateAttr(default_factory=itertools.count)  # numbers the calls, for `seed`

    @property
    def backend_fault(self) -> str | None:
        """Why the server behind this model stopped serving (it died), else None. Its calls since then were
        recorded by the agents as failed; a trainer stops on it rather than learn from answers scored 0."""
        if self._server is not None and not self._server.alive:
            return f"llama-server died: {self._server.log_tail(3)}"
        return None

    def _get_llm_string(self, stop: list[str] | None = None, **kwargs: Any) -> str:
        """The call cache's key of this model (`models.call_cache`): its server's model file and adapters by their
        sha256, not the server's port."""
        server = self._server
        model = server.model if server is not None else self.model_name
        return model_key("mhqa-llama-server", {
            "model": file_sha256(gguf_path(model) if model in PACKS else model, remember=True),
            "lora": [file_sha256(p, remember=True) for p in (server.lora_paths if server is not None else ())],
            "max_tokens": self.max_tokens, "temperature": self.temperature, "seed": self.seed,
            "n_ctx": server.n_ctx if server is not None else 0}, stop, kwargs, repeatable=not self.temperature)

    def _request(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.seed is not None:  # call n samples with seed + n, as in-process (one seed for all would repeat)
            kwargs.setdefault("seed", call_seed(self))
        if "max_new_tokens" in kwargs:
            kwargs["max_tokens"] = kwargs.pop("max_new_tokens")
        grammar = kwargs.pop("grammar", None)
        if grammar:
            kwargs["extra_body"] = {**(self.extra_body or {}), **(kwargs.get("extra_body") or {}), "grammar": grammar}
        return kwargs

    def _without_grammar(self, exc: Exception, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """After a failed call: LlamaServerError if the server died; the request without its grammar if the
        server refused it (HTTP 400); else None (the error stands)."""
        if self._server is not None and not self._server.alive:
            self._server.check()
        body = kwargs.get("extra_body") or {}
        if "grammar" in body and getattr(exc, "status_code", None) == 400:
            return {**kwargs, "extra_body": {k: v for k, v in body.items() if k != "grammar"}}
        return None

    def _finish(self, result: ChatResult, kwargs: dict[str, Any], refused: Exception | None = None) -> ChatResult:
        grammar = "grammar" in (kwargs.get("extra_body") or {})
        for generation in result.generations:
            message = getattr(generation, "message", None)
            if message is None:
                continue
            message.response_metadata["decoding"] = "grammar" if grammar else "prompt"
            if refused is not None:
                message.response_metadata["decoding_error"] = f"llama-server refused the grammar: {refused}"
            usage = message.usage_metadata
            if usage is not None:
                usage["input_token_details"] = {"cache_read": 0, **(usage.get("input_token_details") or {})}
        return result

    def _generate(self, messages: Any, stop: list[str] | None = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        kwargs = self._request(kwargs)
        try:
            return self._finish(super()._generate(messages, stop, run_manager, **kwargs), kwargs)
        except Exception as exc:
            if (retry := self._without_grammar(exc, kwargs)) is None:
                raise
            refused = exc
        return self._finish(super()._generate(messages, stop, run_manager, **retry), retry, refused)

    async def _agenerate(self, messages: Any, stop: list[str] | None = None, run_manager: Any = None,
                         **kwargs: Any) -> ChatResult:
        kwargs = self._request(kwargs)
        try:
            return self._finish(await super()._agenerate(messages, stop, run_manager, **kwargs), kwargs)
        except Exception as exc:
            if (retry := self._without_grammar(exc, kwargs)) is None:
                raise
            refused = exc
        return self._finish(await super()._agenerate(messages, stop, run_manager, **retry), retry, refused)
