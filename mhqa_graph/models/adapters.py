"""LoRA adapters this project trained and ships, loadable by name: `llamacpp:<pack>?lora=<name>`.

Each is a PEFT adapter folder in `mhqa_graph/adapters/<name>/` (its float32 weights as trained: to evaluate or
continue training, e.g. `training/evaluate.py`), trained over one chat pack. llama.cpp reads a GGUF adapter, written
from those weights once into the model cache (`<cache>/adapters/<name>-<digest>.gguf`) as llama.cpp's
`convert_lora_to_gguf.py` would write it: tensor for tensor the file the measurement used, float32 (a float16 file
would be half the size, but is not what was measured). Only an adapter that beat its untrained base on a fresh dev
slice, with its interval above 0 and its records committed, is shipped: see `docs/runs.md`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import struct
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelError, ModelNotInstalled, shown
from .packs import cache_dir

FOLDER = Path(__file__).resolve().parent.parent / "adapters"
WEIGHTS = "adapter_model.safetensors"
LORA_KEY = re.compile(r"layers\.(\d+)\.(\w+\.\w+)\.lora_([AB])\.weight$")  # a PEFT LoRA tensor: layer, module, A/B
GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}  # PEFT's module names -> the GGUF tensors they adapt
_lock = threading.Lock()


@dataclass(frozen=True)
class ShippedAdapter:
    name: str
    base: str  # the chat pack it was trained over (a Qwen2 one: its GGUF tensors are named as GGUF_NAMES says)
    what: str  # one line: the design, the data and what it gained, with where the records are

    @property
    def folder(self) -> Path:
        return FOLDER / self.name


ADAPTERS = {a.name: a for a in (
    ShippedAdapter("omne-pq2h", "qwen2.5-coder-0.5b",
                   "Omne's tool loop on the PathQuestion 2-hop KG: template SFT then 12 stage-1 GRPO steps "
                   "(docs/runs/omne-templates-pq2h); F1 14.4 -> 26.4 on questions 100-199, +12.0 [+1.4, +23.2] "
                   "(docs/runs/omne-templates-pq2h-fresh)"),
)}


def shipped_adapter(name: str, base: str, write: bool = True) -> Path:
    """The GGUF adapter file of the shipped adapter `name` for llama.cpp over the pack `base`, written on first use
    (`write=False`: only checked, and its PEFT weights file returned). ModelError for an unknown name (one error,
    whatever file a path of that name would find) or another base."""
    adapter = ADAPTERS.get(name)
    if adapter is None:
        known = ", ".join(ADAPTERS) or "none"
        raise ModelError(f"llamacpp: lora must name a shipped adapter ({known}), got {shown(name)}; a file of your "
                         "own is lora=file:PATH")
    if base != adapter.base:
        raise ModelError(f"the adapter {name!r} was trained over {adapter.base}; it cannot be put over {shown(base)}")
    weights = adapter.folder / WEIGHTS
    if not weights.is_file():
        raise ModelError(f"the adapter {name!r} has no weights at {weights} (an install without package data?)")
    if not write:
        return weights
    path = cache_dir() / "adapters" / f"{name}-{_digest(weights, weights.stat().st_mtime_ns)}.gguf"
    with _lock:
        if not path.is_file():
            write_gguf(adapter.folder, path)
    return path


@functools.cache
def _digest(path: Path, mtime_ns: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def gguf_tensor(key: str) -> tuple[str, str, str]:
    """The GGUF name of the PEFT LoRA tensor `key`, with its module and which matrix it is (A or B); ModelError
    when it adapts a module with no GGUF name."""
    match = LORA_KEY.search(key)
    if not match or match.group(2) not in GGUF_NAMES:
        raise ModelError(f"no GGUF name for the LoRA tensor {key!r}; targets: {', '.join(GGUF_NAMES)}")
    layer, module, which = match.groups()
    return f"blk.{layer}.{GGUF_NAMES[module]}.weight.lora_{which.lower()}", module, which


def write_gguf(folder: Path, path: Path) -> Path:
    """The PEFT LoRA adapter in `folder` (over a Qwen2 model) as a llama.cpp adapter at `path`."""
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise ModelNotInstalled("a shipped adapter is written for llama.cpp from safetensors weights; "
                                "pip install 'mhqa-graph[models]'") from None
    settings = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    if settings.get("use_rslora") or settings.get("use_dora"):
        raise ModelError(f"{folder}: only a plain LoRA adapter can be written for llama.cpp")
    tensors = {gguf_tensor(key)[0]: value for key, value in load_file(str(folder / WEIGHTS)).items()}
    return write_adapter_gguf(path, "qwen2", float(settings["lora_alpha"]), tensors)


def write_adapter_gguf(path: Path, architecture: str, alpha: float, tensors: dict[str, Any]) -> Path:
    """`tensors` (GGUF name -> numpy array) as a llama.cpp LoRA adapter file at `path` (what llama.cpp's
    `convert_lora_to_gguf.py` writes), written to a temporary file beside it and moved into place."""
    try:
        import gguf
    except ImportError:
        raise ModelNotInstalled("a LoRA adapter is written for llama.cpp with gguf; pip install 'mhqa-graph[models]'"
                                ) from None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".partial")
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(partial, architecture)
        writer.add_string("general.type", "adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", alpha)
        for name, array in sorted(tensors.items()):
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(partial, path)
    finally:
        Path(partial).unlink(missing_ok=True)
    return path


# -- checking an adapter file before llama.cpp reads it ---------------------------------------------------------------
# llama.cpp (through llama-cpp-python 0.3) crashes the process on an adapter it cannot use, so each is checked first.
GGUF_MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_ITEMS = 1 << 20  # tensors, keys or array items a header may declare: more is a damaged file


class _Header:
    """A GGUF file's metadata (scalars and strings; arrays skipped) and tensor shapes (ggml order), read without its
    tensor data; ValueError for a file that is not one."""

    def __init__(self, path: Path) -> None:
        self.size = path.stat().st_size
        with open(path, "rb") as self.f:
            if self.f.read(4) != GGUF_MAGIC:
                raise ValueError("not a GGUF file")
            version, tensors, keys = self._read("<IQQ")
            if version not in (2, 3) or tensors > MAX_ITEMS or keys > MAX_ITEMS:
                raise ValueError(f"an unreadable GGUF header (version {version})")
            self.fields: dict[str, Any] = {}
            for _ in range(keys):
                key = self._string()
                value = self._value(self._read("<I")[0])
                if value is not None:
                    self.fields[key] = value
            self.tensors: dict[str, tuple[int, ...]] = {}
            for _ in range(tensors):
                name = self._string()
                (dims,) = self._read("<I")
                if dims > 4:
                    raise ValueError(f"tensor {name!r} has {dims} dimensions")
                self.tensors[name] = self._read(f"<{dims}Q")
                self._read("<IQ")  # type, offset

    def _read(self, fmt: str) -> tuple:
        data = self.f.read(struct.calcsize(fmt))
        if len(data) != struct.calcsize(fmt):
            raise ValueError("the file ends inside its header")
        return struct.unpack(fmt, data)

    def _string(self) -> str:
        (n,) = self._read("<Q")
        if n > self.size:
            raise ValueError("a string longer than the file")
        return self.f.read(n).decode("utf-8", "replace")

    def _value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self._read(_SCALARS[kind])[0]
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            raise ValueError(f"an unknown GGUF value type {kind}")
        item, count = self._read("<IQ")
        if count > max(MAX_ITEMS, self.size):
            raise ValueError("an array longer than the file")
        if item in _SCALARS:
            self.f.seek(count * struct.calcsize(_SCALARS[item]), os.SEEK_CUR)
        else:
            for _ in range(count):
                self._value(item)
        return None


@functools.cache
def _base_tensors(path: Path, mtime_ns: int) -> tuple[str, dict[str, tuple[int, ...]]]:
    header = _Header(path)
    return str(header.fields.get("general.architecture", "")), header.tensors


def check_adapter_file(path: str | Path, base: str | Path) -> None:
    """ModelError, in one line, unless `path` is a llama.cpp LoRA adapter for the GGUF model `base`: a GGUF file of
    `general.type` adapter, `adapter.type` lora and the base's `general.architecture`, whose tensors are `lora_a` /
    `lora_b` pairs of tensors the base has, in shapes that fit them. Reads the headers only."""
    path, base = Path(path), Path(base)
    try:
        arch, weights = _base_tensors(base, base.stat().st_mtime_ns)
    except (OSError, ValueError) as exc:
        raise ModelError(f"llamacpp: the model {base.name} cannot be read as GGUF ({exc})") from None
    try:
        header = _Header(path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"llamacpp: {shown(str(path))} is not a llama.cpp LoRA adapter: {exc}") from None
    problem = adapter_problem(header.fields, header.tensors, arch, weights)
    if problem:
        raise ModelError(f"llamacpp: {shown(str(path))} is not a LoRA adapter for {base.name}: {problem}")


def adapter_problem(fields: dict[str, Any], tensors: dict[str, tuple[int, ...]], arch: str,
                    weights: dict[str, tuple[int, ...]]) -> str | None:
    """Why an adapter's metadata and tensor shapes (ggml order) do not fit a model of architecture `arch` with these
    weights, or None."""
    said = {key: fields.get(key) for key in ("general.type", "adapter.type", "general.architecture")}
    if said["general.type"] != "adapter" or said["adapter.type"] != "lora":
        return f"general.type {said['general.type']!r} and adapter.type {said['adapter.type']!r}, not adapter and lora"
    if said["general.architecture"] != arch:
        return f"its architecture is {said['general.architecture']!r}, the model's {arch!r}"
    if not tensors:
        return "it has no tensors"
    for name, shape in tensors.items():
        target, _, which = name.rpartition(".lora_")
        if which not in ("a", "b") or target not in weights:
            return f"its tensor {name!r} adapts no weight of the model"
        other = tensors.get(f"{target}.lora_{'b' if which == 'a' else 'a'}")
        if other is None:
            return f"its tensor {name!r} has no lora_{'b' if which == 'a' else 'a'} beside it"
        a, b, w = (shape, other, weights[target]) if which == "a" else (other, shape, weights[target])
        if len(a) != 2 or len(b) != 2 or len(w) < 2 or a[0] != w[0] or b[1] != w[1] or a[1] != b[0]:
            return f"the shapes of {target}'s lora_a {a} and lora_b {b} do not fit the weight's {w}"
    return None
