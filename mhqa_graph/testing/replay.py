"""Recorded real-model transcripts, replayed through the real graphs without a model or a store.

Recording wraps a real chat model and a real store: every model call (its exact prompt, stop
sequences and raw output) and every store read (its arguments and result, or the error it raised)
is kept. Replaying answers the same calls from the transcript:

    transcript = Transcript.load("tests/recorded/omne-pq2h.json")
    llm, store = transcript.replay_model(), transcript.replay_store()
    graph.invoke({"question": ...}, context=make_context("omne", llm=llm, store=store, graph=...))
    llm.assert_complete()   # fails, naming the re-record command, if the graph asked anything new

A prompt the transcript does not hold is never sent to a model: the call raises `Unrecorded`
(the graph records it as a ModelError) and `assert_complete()` fails the test. Re-record after a
prompt change with `python scripts/record_transcripts.py`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field, PrivateAttr

from .. import errors
from ..models.chat import chat_dicts
from ..store.base import KnowledgeStore
from ..types import EntityHit, Fact, NodeInfo, Passage, PassageHit, SearchMode, StoreStats, Triple

RERECORD = "python scripts/record_transcripts.py"


class Unrecorded(errors.ModelError):
    """A replayed model or store was asked something its transcript does not hold."""


def prompt_key(messages: list[BaseMessage] | list[dict[str, str]], stop: list[str] | None = None) -> str:
    """The key of a model call: sha256 of its exact messages (role, content) and stop sequences."""
    chat = messages if messages and isinstance(messages[0], dict) else chat_dicts(messages)  # type: ignore[arg-type]
    blob = json.dumps({"messages": chat, "stop": list(stop or [])}, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def store_key(method: str, *args: Any) -> str:
    return json.dumps([method, *args], ensure_ascii=False)


@dataclass
class Transcript:
    """What one recording saw: `meta` (model, sha256, date, agent, environment, settings), the
    `questions` asked, the model calls by prompt key and the store reads by call key."""

    meta: dict[str, Any] = field(default_factory=dict)
    questions: list[dict[str, Any]] = field(default_factory=list)
    llm: dict[str, dict[str, Any]] = field(default_factory=dict)
    store: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> Transcript:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(**{k: data.get(k, v) for k, v in asdict(cls()).items()})

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        return path

    def replay_model(self) -> ReplayChatModel:
        return ReplayChatModel(calls=self.llm, source=str(self.meta.get("file", "the transcript")))

    def replay_store(self) -> ReplayStore:
        return ReplayStore(self.store)


# -- the model ------------------------------------------------------------------------------------
def _message(text: str, n_in: int = 0, n_out: int = 0) -> ChatResult:
    message = AIMessage(content=text, usage_metadata={"input_tokens": n_in, "output_tokens": n_out,
                                                      "total_tokens": n_in + n_out},
                        response_metadata={"model_name": "replay", "finish_reason": "stop"})
    return ChatResult(generations=[ChatGeneration(message=message)])


class RecordingChatModel(BaseChatModel):
    """Passes every call to `inner` and keeps its prompt, stop sequences and raw output in `calls`.
    `pass_stop=False` plays a provider without stop sequences: `inner` is called without them, and they
    are still recorded, so that the graph's calls replay."""

    inner: BaseChatModel
    pass_stop: bool = True
    calls: dict[str, dict[str, Any]] = Field(default_factory=dict)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "mhqa-recording"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        reply = self.inner.invoke(messages, stop=stop if self.pass_stop else None, **kwargs)
        usage = reply.usage_metadata or {}
        with self._lock:
            self.calls[prompt_key(messages, stop)] = {
                "messages": chat_dicts(messages), "stop": list(stop or []), "output": reply.text,
                "input_tokens": usage.get("input_tokens", 0), "output_tokens": usage.get("output_tokens", 0)}
        return _message(reply.text, usage.get("input_tokens", 0), usage.get("output_tokens", 0))


class ReplayChatModel(BaseChatModel):
    """Answers each call with the output recorded for its exact prompt; anything else is `Unrecorded`."""

    calls: dict[str, dict[str, Any]]
    source: str = "the transcript"
    misses: list[list[dict[str, str]]] = Field(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "mhqa-replay"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        call = self.calls.get(prompt_key(messages, stop))
        if call is None:
            with self._lock:
                self.misses.append(chat_dicts(messages))
            raise Unrecorded(f"{self.source} holds no reply to this prompt; re-record: {RERECORD}")
        return _message(call["output"], call.get("input_tokens", 0), call.get("output_tokens", 0))

    def assert_complete(self) -> None:
        """Fail (AssertionError) if any prompt was not in the transcript, showing the end of the first."""
        if self.misses:
            last = self.misses[0][-1]["content"][-600:]
            raise AssertionError(f"{len(self.misses)} prompt(s) are not in {self.source}: the graph now asks "
                                 f"the model something else. Re-record with `{RERECORD}`.\n"
                                 f"End of the first unrecorded prompt:\n{last}")


# -- the store ------------------------------------------------------------------------------------
_ERROR_ARGS = {"EntityNotFound": ("graph", "name"), "UnknownGraph": ("graph",), "UnknownCorpus": ("corpus",)}


def _error_json(exc: errors.MhqaError) -> dict[str, Any]:
    name = type(exc).__name__
    args = [getattr(exc, a) for a in _ERROR_ARGS[name]] if name in _ERROR_ARGS else [str(exc)]
    return {"error": name, "args": args}


def _raise(data: dict[str, Any]) -> None:
    cls = getattr(errors, data["error"], errors.StoreError)
    raise cls(*data["args"])


class RecordingStore(KnowledgeStore):
    """A read-only view of `inner` that keeps every read (arguments, result or error) in `reads`."""

    backend = "recording"

    def __init__(self, inner: KnowledgeStore) -> None:
        self.inner, self.uri = inner, inner.uri
        self.reads: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _record(self, key: str, run: Any, dump: Any) -> Any:
        try:
            result = run()
        except errors.MhqaError as exc:
            with self._lock:
                self.reads[key] = _error_json(exc)
            raise
        with self._lock:
            self.reads[key] = {"result": dump(result)}
        return result

    def _match_entities(self, graph: str, text: str, k: int) -> list[EntityHit]:
        return self._record(store_key("match_entities", graph, text, k),
                            lambda: self.inner.match_entities(graph, text, k), lambda r: [asdict(h) for h in r])

    def _node_info(self, graph: str, name: str) -> NodeInfo:
        return self._record(store_key("node_info", graph, name), lambda: self.inner.node_info(graph, name), asdict)

    def _search(self, corpus: str, query: str, k: int, mode: SearchMode) -> list[PassageHit]:
        return self._record(store_key("search", corpus, query, k, mode),
                            lambda: self.inner.search(corpus, query, k, mode), lambda r: [asdict(h) for h in r])

    def _collection_names(self, kind: str) -> list[str]:
        return self._record(store_key("names", kind), lambda: self.inner._collection_names(kind), list)

    def _passages(self, corpus: str) -> Iterator[Passage]:
        raise errors.InvalidInput("a recorded store does not list whole corpora")

    def _add_triples(self, graph: str, triples: list[Triple]) -> int:
        raise errors.InvalidInput("a recording store is read-only")

    _add_passages = _add_triples  # type: ignore[assignment]

    def _stats(self) -> StoreStats:
        return self.inner.stats()

    def close(self) -> None:
        """The inner store belongs to the caller."""


class ReplayStore(KnowledgeStore):
    """Answers the reads a `RecordingStore` kept; any other read raises `Unrecorded`."""

    backend = "replay"
    uri = "replay://"

    def __init__(self, reads: dict[str, Any]) -> None:
        self.reads = reads
        self.misses: list[str] = []

    def _read(self, key: str) -> Any:
        if key not in self.reads:
            self.misses.append(key)
            raise Unrecorded(f"the transcript holds no store read {key}; re-record: {RERECORD}")
        data = self.reads[key]
        if "error" in data:
            _raise(data)
        return data["result"]

    def _match_entities(self, graph: str, text: str, k: int) -> list[EntityHit]:
        return [EntityHit(**h) for h in self._read(store_key("match_entities", graph, text, k))]

    def _node_info(self, graph: str, name: str) -> NodeInfo:
        data = self._read(store_key("node_info", graph, name))
        return NodeInfo(graph=data["graph"], name=data["name"], facts=[Fact(**f) for f in data["facts"]])

    def _search(self, corpus: str, query: str, k: int, mode: SearchMode) -> list[PassageHit]:
        return [PassageHit(**h) for h in self._read(store_key("search", corpus, query, k, mode))]

    def _collection_names(self, kind: str) -> list[str]:
        return list(self._read(store_key("names", kind)))

    def _passages(self, corpus: str) -> Iterator[Passage]:
        raise Unrecorded("a replayed store does not list whole corpora")

    def _add_triples(self, graph: str, triples: list[Triple]) -> int:
        raise errors.InvalidInput("a replayed store is read-only")

    _add_passages = _add_triples  # type: ignore[assignment]

    def _stats(self) -> StoreStats:
        return StoreStats(backend="replay", graphs={}, corpora={})

    def close(self) -> None:
        """Nothing to release."""
