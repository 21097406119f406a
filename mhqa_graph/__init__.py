"""mhqa-graph: multi-hop question answering agents on LangGraph, over one knowledge store."""

from __future__ import annotations

from .errors import (
    CorruptStore,
    EmbedderMismatch,
    EntityNotFound,
    IngestError,
    InvalidInput,
    InvalidQuestion,
    InvalidStoreURI,
    MhqaError,
    ModelError,
    ModelNotInstalled,
    StoreBusy,
    StoreError,
    StoreLocked,
    StoreUnavailable,
    UnknownCorpus,
    UnknownGraph,
)
from .store import KnowledgeStore, open_store
from .types import EntityHit, Fact, NodeInfo, Passage, PassageHit, StoreStats, Triple

__version__ = "0.1.0"

__all__ = [
    "CorruptStore", "EmbedderMismatch", "EntityHit", "EntityNotFound", "Fact", "IngestError", "InvalidInput",
    "InvalidQuestion", "InvalidStoreURI", "KnowledgeStore", "MhqaError", "ModelError", "ModelNotInstalled",
    "NodeInfo", "Passage",
    "PassageHit", "StoreBusy", "StoreError", "StoreLocked", "StoreStats", "StoreUnavailable", "Triple", "UnknownCorpus",
    "UnknownGraph", "open_store",
]
