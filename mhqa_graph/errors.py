"""Typed errors. Every failure a user can cause or meet is one of these."""

from __future__ import annotations

from typing import Any

MAX_ECHO = 80  # characters of a value a user gave that an error message repeats


def shown(value: Any, limit: int = MAX_ECHO) -> str:
    """`value` as an error message repeats it: its repr, cut to `limit` characters (saying how long it was); an
    integer too long to print (Python's 4,300 digits) by its number of digits."""
    try:
        text = repr(value)
    except ValueError:  # int's limit on the digits it converts
        return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


class MhqaError(Exception):
    """Base class of every error mhqa-graph raises on purpose."""


class StoreError(MhqaError):
    """A knowledge-store operation failed."""


class InvalidStoreURI(StoreError):
    """The store URI has an unknown scheme or a malformed location."""


class StoreNotFound(StoreError):
    """No store exists at the URI (and the operation only reads one)."""


def _in_store(store: str | None) -> str:
    return f" in {store}" if store else ""


class UnknownGraph(StoreError):
    """No graph with this name exists in the store."""

    def __init__(self, graph: str, store: str | None = None) -> None:
        super().__init__(f"unknown graph {graph!r}{_in_store(store)}; ingest it first (mhqa ingest ...) "
                         "or check `mhqa stats`")
        self.graph = graph
        self.store = store


class UnknownCorpus(StoreError):
    """No passage corpus with this name exists in the store."""

    def __init__(self, corpus: str, store: str | None = None) -> None:
        super().__init__(f"unknown corpus {corpus!r}{_in_store(store)}; ingest it first (mhqa ingest ...) "
                         "or check `mhqa stats`")
        self.corpus = corpus
        self.store = store


class EntityNotFound(StoreError):
    """The graph exists but has no node with this exact name."""

    def __init__(self, graph: str, name: str) -> None:
        super().__init__(f"no entity named {name!r} in graph {graph!r}; use match_entities to find the right name")
        self.graph = graph
        self.name = name


class StoreUnavailable(StoreError):
    """The database cannot be reached, refused the credentials, or timed out."""


class StoreLocked(StoreError):
    """Another process holds the embedded store open for writing."""


class StoreBusy(StoreError):
    """Another process is writing the embedded store at this moment; retrying later succeeds."""


class CorruptStore(StoreError):
    """Files of an embedded store are missing, half-written or inconsistent."""


class EmbedderMismatch(StoreError):
    """The store was built with another embedding model than the one asked for."""


class InvalidInput(MhqaError):
    """An argument is out of range or of the wrong shape (empty name, k < 1, unknown mode)."""


class IngestError(MhqaError):
    """A row of an input file is malformed. Carries the file and line."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None) -> None:
        where = f"{path}:{line}: " if path and line else (f"{path}: " if path else "")
        super().__init__(f"{where}{message}")
        self.path = path
        self.line = line


class ModelError(MhqaError):
    """A model spec cannot be resolved or a model pack cannot be loaded."""


class CorruptCache(ModelError):
    """A call cache file (`--llm-cache`) or one of its entries cannot be read: never answered from."""


class ModelNotInstalled(ModelError):
    """The offline pack's wheel is not installed; the message names the pip extra."""


class ChecksumMismatch(ModelError):
    """An assembled model file does not have its pinned sha256."""


class ModelNotFound(ModelError):
    """A model name is not an installed pack, not a local folder, and cannot be had from the Hugging Face Hub
    (not there, not reachable, or not in the cache while HF_HUB_OFFLINE is set)."""


class DeviceError(ModelError):
    """A local model failed on its device or dtype: tensors on two devices, a dtype the device cannot
    compute in, a CUDA error or no memory left on it."""


class TrainingError(MhqaError):
    """A training run stopped because what it would learn from is unsound: e.g. the policy failed on its
    device during a rollout, which would otherwise be scored as a wrong answer and trained on."""


class CheckpointError(TrainingError):
    """A checkpoint to resume from is not what a trainer writes: a symbolic link among its files, or a state.json
    that is not a JSON object of the expected types."""


class DevSliceError(InvalidInput):
    """A trainer's dev slice cannot measure it: it shares questions with the training slice, or holds fewer
    questions than the config asks for (`dev.min_questions`)."""


class Forbidden(MhqaError):
    """A served graph refused what a request asked for: a foreign web page (`Origin`), a host name that is not the
    server's, or a model or store the operator did not allow (SECURITY.md, "The served graph")."""


class InvalidQuestion(MhqaError):
    """A question that cannot be asked: not a string, empty after cleaning, or too long."""
