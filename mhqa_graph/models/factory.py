"""Turn a model spec string into a LangChain chat model or embeddings object.

Chat specs: a pack name ("smollm2-135m"), "hf:<folder or cached hub id>",
"llamacpp:<pack name or .gguf file>[?threads=N&ctx=N&cache=MB&lora=<adapter .gguf>&slots=N]" (llama.cpp;
needs the `llamacpp` extra; faster than transformers on the CPU), "openai:<base url>[#model]",
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
import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel

from ..embeddings import Embedder, load_embedder
from ..errors import ModelError, ModelNotInstalled
from .adapters import shipped_adapter
from .packs import PACKS, check_chat_pack, gguf_path, pack_installed, pack_path

CHAT_PREFERENCE = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m")
REQUEST_TIMEOUT_S = 60.0  # per HTTP request to an openai-compatible server
LLAMACPP_OPTIONS = {"threads": "n_threads", "ctx": "n_ctx", "cache": "prompt_cache_mb",  # spec query -> field
                    "slots": "slots"}  # slots: llama-server (models.server)
MAY_BE_ZERO = {"cache"}  # 0 turns it off
LLAMACPP_FILE_OPTIONS = {"lora": "lora_path"}  # the same, for options naming a file
OPENAI_HINT = "openai-compatible servers need langchain-openai; pip install 'mhqa-graph[openai]'"


def best_installed_chat_pack() -> str | None:
    """The strongest chat pack whose wheels are installed, or None."""
    return next((name for name in CHAT_PREFERENCE if pack_installed(name)), None)


def check_chat_spec(spec: Any, model: str = "") -> None:
    """ModelError (ModelNotInstalled for a missing extra or pack) unless `spec` names a chat model
    that `load_chat_model` can load (`model`: an openai spec's model if it has no #model); cheap:
    loads, assembles and converts nothing."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelError(f"a chat model spec must be a non-empty string, got {spec!r}")
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
        raise ModelError(f"unknown chat model spec {spec!r}; use a pack name ({', '.join(CHAT_PREFERENCE)}), "
                         "'hf:<folder or hub id>', "
                         "'llamacpp:<pack name or .gguf file>[?threads=N&ctx=N&cache=MB&lora=<adapter .gguf>"
                         "&slots=N]', "
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
    return base_url, model


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
    return ChatOpenAI(base_url=base_url, model=model, api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"), **kwargs)


def _llamacpp_options(rest: str, write: bool = True) -> tuple[str, dict[str, int | str]]:
    """The model reference and the LlamaCppChatModel fields of '<ref>[?threads=N&ctx=N&cache=MB&lora=<file>]'
    (`lora` may also name a shipped adapter, models/adapters.py: its GGUF file, written unless `write` is False)."""
    ref, _, query = rest.partition("?")
    options: dict[str, int | str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, separator="&"):
        if key in LLAMACPP_FILE_OPTIONS:
            if key == "lora" and not Path(value).expanduser().is_file() and not value.endswith(".gguf"):  # a name
                options[LLAMACPP_FILE_OPTIONS[key]] = str(shipped_adapter(value, ref, write))
                continue
            if not Path(value).expanduser().is_file():
                raise ModelError(f"llamacpp: {key} must name an existing file, got {value!r}")
            options[LLAMACPP_FILE_OPTIONS[key]] = str(Path(value).expanduser())
            continue
        if key not in LLAMACPP_OPTIONS:
            known = ", ".join([*LLAMACPP_OPTIONS, *LLAMACPP_FILE_OPTIONS])
            raise ModelError(f"llamacpp: unknown option {key!r}; known: {known}")
        if not value.isdigit() or int(value) < (key not in MAY_BE_ZERO):
            kind = "a non-negative" if key in MAY_BE_ZERO else "a positive"
            raise ModelError(f"llamacpp: {key} must be {kind} integer, got {value!r}")
        options[LLAMACPP_OPTIONS[key]] = int(value)
    return ref, options


def _llamacpp_ref(ref: str) -> None:
    if importlib.util.find_spec("llama_cpp") is None:  # fail before assembling a pack's GGUF
        raise ModelNotInstalled("llamacpp: models need llama-cpp-python; pip install 'mhqa-graph[llamacpp]'")
    if ref in PACKS:
        check_chat_pack(ref, gguf=True)
    elif not (ref.endswith(".gguf") and Path(ref).expanduser().is_file()):
        raise ModelError(f"llamacpp: expects a chat pack name ({', '.join(CHAT_PREFERENCE)}) or an existing "
                         f".gguf file, got {ref!r}")


def _llamacpp(rest: str, **kwargs: Any) -> BaseChatModel:
    """'llamacpp:<pack name or .gguf file>[?threads=N&ctx=N&cache=MB&lora=<adapter .gguf>&slots=N]'; a pack's
    GGUF is assembled and kept once. With slots, a ChatOpenAI on the shared llama-server of these settings."""
    ref, options = _llamacpp_options(rest)
    if "slots" in options:
        from .server import shared_server

        return shared_server(ref if ref in PACKS else Path(ref).expanduser(), **options).chat_model(**kwargs)
    kwargs.update(options)
    if ref in PACKS:
        path = gguf_path(ref)
        kwargs.setdefault("model_name", ref)
    else:
        path = Path(ref).expanduser()
    from .llamacpp import LlamaCppChatModel

    return LlamaCppChatModel(model_path=str(path), **kwargs)


def _hf_location(ref: str) -> str:
    """A local folder as is; a hub id only if it is already in the Hugging Face cache (no downloads)."""
    if Path(ref).expanduser().is_dir():
        return str(Path(ref).expanduser())
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        raise ModelNotInstalled("hf: models need transformers; pip install 'mhqa-graph[models]'") from None
    try:
        cached = try_to_load_from_cache(ref, "config.json")
    except ValueError:  # not a valid hub id either
        cached = None
    if not isinstance(cached, str):
        raise ModelError(f"hf:{ref} is neither a local folder nor a model in the Hugging Face cache")
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
