"""Turn a model spec string into a LangChain chat model or embeddings object.

Chat specs: a pack name ("smollm2-135m"), "hf:<folder or cached hub id>",
"llamacpp:<pack name or .gguf file>[?threads=N&ctx=N&cache=MB&chunk=N&lora=<shipped adapter>&slots=N]" (llama.cpp;
needs the `llamacpp` extra; faster than transformers on the CPU; `lora=file:PATH` opts in to an adapter file of your
own, checked before llama.cpp reads it), "openai:<base url>[#model]",
"fake" or "fake:<json list of responses>". `check_chat_spec` validates a spec without loading it.

A `llamacpp:` spec runs the model in this process, one call at a time, unless it has `slots=N`: then the
model runs in llama.cpp's own server (`models.server.LlamaServer`, one shared per distinct settings in the
process, on 127.0.0.1, stopped at exit), which decodes up to N calls at once in one batch, each slot with
`ctx` tokens and its own prompt cache (`cache`: its RAM cache of further prompt states, MB). The model is a
`ChatOpenAI` on that server, constrained by the same grammars; it needs the `openai` extra and the
`llama-server` binary (`bash scripts/llama_server.sh`). `LlamaServer(...).spec` gives the `openai:` spec of
a server started by hand.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel

from ..embeddings import Embedder, load_embedder
from ..errors import ModelError, ModelNotInstalled, shown
from ..paths import expand_user_path, is_dir, is_file
from ..redaction import redact, secret_params
from .adapters import check_adapter_file, shipped_adapter
from .packs import PACKS, check_chat_pack, gguf_path, pack_installed, pack_path

CHAT_PREFERENCE = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m")
REQUEST_TIMEOUT_S = 60.0  # per HTTP request to an openai-compatible server
LLAMACPP_OPTIONS = {"threads": "n_threads", "ctx": "n_ctx", "cache": "prompt_cache_mb",  # spec query -> field
                    "chunk": "prefill_chunk", "slots": "slots"}  # slots: llama-server (models.server)
MAY_BE_ZERO = {"cache", "chunk"}  # 0 turns it off
LLAMACPP_FILE_OPTIONS = {"lora": "lora_path"}  # the same, for options naming a shipped adapter or a file
FILE_PREFIX = "file:"  # lora=file:PATH: a path, where the caller opts in to one (lora=NAME is a shipped adapter)
OPENAI_KEY_ENV, KEY_URLS_ENV = "OPENAI_API_KEY", "MHQA_OPENAI_KEY_URLS"
OPENAI_DEFAULT_URL = "https://api.openai.com/v1"
OPENAI_HINT = "openai-compatible servers need langchain-openai; pip install 'mhqa-graph[openai]'"
log = logging.getLogger(__name__)
_announced: set[str] = set()  # the default specs this process has named on stderr


def best_installed_chat_pack() -> str | None:
    """The strongest chat pack whose wheels are installed, or None."""
    return next((name for name in CHAT_PREFERENCE if pack_installed(name)), None)


def default_chat_spec() -> str | None:
    """The spec that `llm="auto"` (and a CLI run without --llm) loads: `llamacpp:<best installed pack>` where
    llama-cpp-python is installed (the pack's Q4 GGUF: about twice as fast as transformers on a CPU, with nothing to
    convert, and the token log-probabilities `auto`'s min_confidence reads), else the pack through transformers;
    None without an installed chat pack. The first time a process resolves it to a spec, it says which on stderr."""
    pack = best_installed_chat_pack()
    if pack is None:
        return None
    spec = f"llamacpp:{pack}" if importlib.util.find_spec("llama_cpp") is not None else pack
    if spec not in _announced:
        _announced.add(spec)
        how = "llama.cpp is installed" if spec != pack else "through transformers: llama-cpp-python is not installed"
        log.warning("llm auto: %s (%s; --llm or llm= picks another)", spec, how)
    return spec


def check_chat_spec(spec: Any, model: str = "") -> None:
    """ModelError (ModelNotInstalled for a missing extra or pack) unless `spec` names a chat model
    that `load_chat_model` can load (`model`: an openai spec's model if it has no #model); cheap:
    loads, assembles and converts nothing."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelError(f"a chat model spec must be a non-empty string, got {shown(spec)}")
    scheme, _, rest = spec.partition(":")
    if scheme == "fake":
        _fake_responses(rest)
    elif scheme == "openai":
        _openai_target(rest, model)
        if importlib.util.find_spec("langchain_openai") is None:
            raise ModelNotInstalled(OPENAI_HINT)
    elif scheme == "hf" and rest:
        _hf_location(rest)
    elif scheme == "llamacpp":
        ref, options = _llamacpp_options(rest, write=False)
        _llamacpp_ref(ref)
        if "slots" in options:
            if importlib.util.find_spec("langchain_openai") is None:
                raise ModelNotInstalled(OPENAI_HINT)
            from .server import find_binary

            find_binary()
    elif spec in PACKS:
        check_chat_pack(spec)
    else:
        raise ModelError(f"unknown chat model spec {redact(spec)[:200]!r}; use a pack name "
                         f"({', '.join(CHAT_PREFERENCE)}), "
                         "'hf:<folder or hub id>', "
                         "'llamacpp:<pack name or .gguf file>[?threads=N&ctx=N&cache=MB&lora=<shipped adapter or "
                         "file:PATH>&slots=N]', "
                         "'openai:<base url>#<model>' or 'fake[:<json list>]'")


def load_chat_model(spec: str, **kwargs: Any) -> BaseChatModel:
    """The chat model for `spec`; kwargs go to the model class (max_new_tokens, temperature, model, ...)."""
    check_chat_spec(spec, kwargs.get("model", ""))
    scheme, _, rest = spec.partition(":")
    if scheme == "fake":
        return _fake(rest, **kwargs)
    if scheme == "openai":
        return _openai(rest, **kwargs)
    if scheme == "hf":
        return _transformers(_hf_location(rest), **kwargs)
    if scheme == "llamacpp":
        return _llamacpp(rest, **kwargs)
    return _transformers(str(pack_path(spec)), model_name=spec, **kwargs)


def _fake_responses(rest: str) -> list[str] | None:
    if not rest:
        return None
    try:
        responses = json.loads(rest)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ModelError(f"fake: expects a JSON list of strings, e.g. 'fake:[\"an answer\"]': {exc}") from None
    if not isinstance(responses, list) or not all(isinstance(r, str) for r in responses):
        raise ModelError("fake: expects a JSON list of strings, e.g. 'fake:[\"an answer\"]'")
    if not responses:
        raise ModelError("fake:[] scripts no reply; give at least one, e.g. 'fake:[\"an answer\"]'")
    return responses


def _fake(rest: str, **kwargs: Any) -> BaseChatModel:
    from ..testing.fakes import FakeChatModel

    responses = _fake_responses(rest)
    if responses is not None:
        kwargs["responses"] = responses
    return FakeChatModel(**kwargs)


def _openai_target(rest: str, model: str) -> tuple[str, str]:
    base_url, _, fragment = rest.partition("#")
    model = fragment or model
    if not base_url or not model:
        raise ModelError("openai: needs a base url and a model: 'openai:<base url>#<model>' or model=...")
    try:
        parts = urlsplit(base_url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as exc:
        raise ModelError(f"openai: {shown(redact(base_url))} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ModelError(f"openai: the base url must be http(s)://host[:port]/path, got {shown(redact(base_url))}")
    if secret := secret_params(base_url):
        raise ModelError(f"openai: a spec holds no secret ({secret[0]}=): it would be recorded with the run; "
                         f"set {OPENAI_KEY_ENV} (sent to {', '.join(key_base_urls())}, and to the base URLs "
                         f"in {KEY_URLS_ENV})")
    return base_url, model


def key_base_urls() -> list[str]:
    """The base URLs the operator configured, the only ones `OPENAI_API_KEY` is sent to: OpenAI's own,
    `OPENAI_BASE_URL`, and those in `MHQA_OPENAI_KEY_URLS` (comma-separated)."""
    urls = [OPENAI_DEFAULT_URL, os.environ.get("OPENAI_BASE_URL", "")]
    urls += os.environ.get(KEY_URLS_ENV, "").split(",")
    return [u.strip().rstrip("/") for u in urls if u.strip()]


def _base(url: str) -> tuple[str, str, int | None, str]:
    """(scheme, host, port, path) of a base URL, without its userinfo, query or fragment."""
    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.scheme.lower(), (parts.hostname or "").lower(), port, parts.path.rstrip("/")


def api_key_for(base_url: str) -> str:
    """`OPENAI_API_KEY` for a base URL the operator configured (`key_base_urls`), else a placeholder: a
    spec's URL never receives the key unless the operator named it."""
    key = os.environ.get(OPENAI_KEY_ENV)
    if key and any(_base(base_url) == _base(url) for url in key_base_urls()):
        return key
    return "EMPTY"


def _openai(rest: str, **kwargs: Any) -> BaseChatModel:
    base_url, model = _openai_target(rest, kwargs.pop("model", ""))
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:
        raise ModelNotInstalled(OPENAI_HINT) from None
    if "max_new_tokens" in kwargs:  # the local models' name for it
        kwargs["max_tokens"] = kwargs.pop("max_new_tokens")
    kwargs.setdefault("timeout", REQUEST_TIMEOUT_S)
    kwargs.setdefault("max_retries", 0)  # get_llm retries transient failures itself, with backoff
    key = api_key_for(base_url)
    if key != "EMPTY" and urlsplit(base_url).username is not None:  # httpx would send Basic auth in its stead
        raise ModelError(f"openai: {redact(base_url)} has a user and {OPENAI_KEY_ENV} would be sent to it: give one "
                         "credential, not both")
    return ChatOpenAI(base_url=base_url, model=model, api_key=key, **kwargs)


def _llamacpp_options(rest: str, write: bool = True) -> tuple[str, dict[str, int | str]]:
    """The model reference and the LlamaCppChatModel fields of '<ref>[?threads=N&ctx=N&cache=MB&lora=<name>]'
    (`lora`: a shipped adapter, models/adapters.py, whose GGUF file is written unless `write` is False; or
    `file:PATH`, an adapter file the caller opts in to)."""
    ref, _, query = rest.partition("?")
    options: dict[str, int | str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, separator="&"):
        if key in LLAMACPP_FILE_OPTIONS:
            if not value.startswith(FILE_PREFIX):  # a name; a path is one too, and refused as any unknown name
                options[LLAMACPP_FILE_OPTIONS[key]] = str(shipped_adapter(value, ref, write))
                continue
            path = expand_user_path(value[len(FILE_PREFIX):], ModelError)
            if not is_file(path):
                raise ModelError(f"llamacpp: {key}={FILE_PREFIX} names no file, got {shown(value)}")
            options[LLAMACPP_FILE_OPTIONS[key]] = str(path)
            continue
        if key not in LLAMACPP_OPTIONS:
            known = ", ".join([*LLAMACPP_OPTIONS, *LLAMACPP_FILE_OPTIONS])
            raise ModelError(f"llamacpp: unknown option {shown(key)}; known: {known}")
        if not (value.isascii() and value.isdigit() and len(value) <= 9) or int(value) < (key not in MAY_BE_ZERO):
            kind = "a non-negative" if key in MAY_BE_ZERO else "a positive"
            raise ModelError(f"llamacpp: {key} must be {kind} integer of at most 9 digits, got {shown(value)}")
        options[LLAMACPP_OPTIONS[key]] = int(value)
    return ref, options


def _llamacpp_ref(ref: str) -> None:
    if importlib.util.find_spec("llama_cpp") is None:  # fail before assembling a pack's GGUF
        raise ModelNotInstalled("llamacpp: models need llama-cpp-python; pip install 'mhqa-graph[llamacpp]'")
    if ref in PACKS:
        check_chat_pack(ref, gguf=True)
    elif not (ref.endswith(".gguf") and is_file(expand_user_path(ref, ModelError))):
        raise ModelError(f"llamacpp: expects a chat pack name ({', '.join(CHAT_PREFERENCE)}) or an existing "
                         f".gguf file, got {shown(ref)}")


def _llamacpp(rest: str, **kwargs: Any) -> BaseChatModel:
    """'llamacpp:<pack name or .gguf file>[?threads=N&ctx=N&cache=MB&lora=<name or file:PATH>&slots=N]'; a pack's
    GGUF is assembled and kept once. The adapter (`lora`, or a `lora_path` kwarg) is checked against the model
    before llama.cpp reads it (`adapters.check_adapter_file`). With slots, a ChatOpenAI on the shared llama-server of
    these settings."""
    ref, options = _llamacpp_options(rest)
    path = gguf_path(ref) if ref in PACKS else expand_user_path(ref, ModelError)
    if lora := options.get("lora_path") or kwargs.get("lora_path"):
        check_adapter_file(str(lora), path)
    if "slots" in options:
        from .server import shared_server

        if "prefill_chunk" in options:
            raise ModelError("llamacpp: chunk= is the in-process model's; llama-server batches calls together, so "
                             "its replies need not repeat")

        return shared_server(ref if ref in PACKS else path, **options).chat_model(**kwargs)
    kwargs.update(options)
    if ref in PACKS:
        kwargs.setdefault("model_name", ref)
    from .llamacpp import LlamaCppChatModel

    return LlamaCppChatModel(model_path=str(path), **kwargs)


def _hf_location(ref: str) -> str:
    """A local folder as is; a hub id only if it is already in the Hugging Face cache (no downloads)."""
    if is_dir(folder := expand_user_path(ref, ModelError)):
        return str(folder)
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        raise ModelNotInstalled("hf: models need transformers; pip install 'mhqa-graph[models]'") from None
    try:
        cached = try_to_load_from_cache(ref, "config.json")
    except ValueError:  # not a valid hub id either
        cached = None
    if not isinstance(cached, str):
        raise ModelError(f"hf:{shown(ref)[1:-1]} is neither a local folder nor a model in the Hugging Face cache")
    return ref


def _transformers(path: str, **kwargs: Any) -> BaseChatModel:
    from .chat import TransformersChatModel

    return TransformersChatModel(model_path=path, **kwargs)


class EmbedderEmbeddings(Embeddings):
    """LangChain `Embeddings` over an mhqa-graph embedder."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embedder.embed(list(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embedder.embed([text])[0].tolist()


def load_embeddings(spec: str | None = "auto") -> Embeddings:
    """LangChain embeddings for an embedder spec ("auto", "all-minilm-l6-v2", "hash:<dim>", "st:<folder>")."""
    return EmbedderEmbeddings(load_embedder(spec))
