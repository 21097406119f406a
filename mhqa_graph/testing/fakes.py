"""A scripted chat model for tests: no weights, deterministic, records every call."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field, PrivateAttr

from ..errors import ModelError
from ..models.prefix_cache import common_prefix

TOKENS = re.compile(r"<[^>]*>|[^<]+")  # a scripted reply's tokens, when it gives log-probabilities: tags and text


class FakeChatModel(BaseChatModel):
    """Replies from `responses` in order (cycled, or ModelError when exhausted and `cycle` is False),
    else from `respond(messages)`, else echoes the last message. Usage counts words as tokens, and the
    words a prompt shares at its start with the previous call's as read from a cache."""

    responses: list[str] | None = None
    respond: Callable[[list[BaseMessage]], str] | None = None
    cycle: bool = True
    latency: float = 0.0  # seconds slept per call
    accepts_grammar: bool = False  # play a llama.cpp model: take `grammar=` and keep it in `grammars`
    logprob: float | None = None  # play a backend with token log-probabilities: each token of a reply (a tag, or
    # the text between tags) gets this one when asked with `logprobs=True` (mhqa_graph.models.logprobs)
    calls: list[list[BaseMessage]] = Field(default_factory=list)
    grammars: list[str | None] = Field(default_factory=list)  # per call, the grammar it was given

    _index: int = PrivateAttr(default=0)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _previous: list[str] = PrivateAttr(default_factory=list)  # the last prompt's words

    @property
    def _llm_type(self) -> str:
        return "mhqa-fake"

    @property
    def accepts_logprobs(self) -> bool:
        return self.logprob is not None

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"responses": self.responses, "cycle": self.cycle, "latency": self.latency}

    def _next_scripted(self) -> str:
        if not self.responses or (self._index >= len(self.responses) and not self.cycle):
            raise ModelError(f"FakeChatModel: scripted responses exhausted after {self._index} calls")
        text = self.responses[self._index % len(self.responses)]
        self._index += 1
        return text

    def _reply(self, messages: list[BaseMessage], grammar: str | None = None, logprobs: bool = False) -> ChatResult:
        words = [w for m in messages for w in m.text.split()]  # a fake token is a word
        with self._lock:
            cached = common_prefix(words, self._previous)  # a cache of the previous call's prompt
            self._previous = words
            self.calls.append(list(messages))
            self.grammars.append(grammar)
            text = self._next_scripted() if self.responses is not None else None
        if text is None:
            text = self.respond(messages) if self.respond else (messages[-1].text if messages else "")
        n_in, n_out = len(words), len(text.split())
        scored = {"logprobs": {"content": [{"token": t, "logprob": self.logprob} for t in TOKENS.findall(text)]}} \
            if logprobs and self.accepts_logprobs else {}
        message = AIMessage(content=text,
                            usage_metadata={"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out,
                                            "input_token_details": {"cache_read": cached}},
                            response_metadata={"model_name": "fake", "finish_reason": "stop", **scored})
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        if self.latency:
            time.sleep(self.latency)
        return self._reply(messages, kwargs.get("grammar"), bool(kwargs.get("logprobs")))

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        if self.latency:
            await asyncio.sleep(self.latency)
        return self._reply(messages, kwargs.get("grammar"), bool(kwargs.get("logprobs")))


class FakeToolCallingModel(FakeChatModel):
    """A scripted chat model with native tool calling: `bind_tools` records the tools (in `tools`) and
    each reply is the next of `messages` (AIMessages, which may carry `tool_calls`, or plain strings)."""

    messages: list[Any] = Field(default_factory=list)  # AIMessage or str
    tools: list[Any] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "mhqa-fake-tools"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        self.tools = list(tools)
        return self

    def _reply(self, messages: list[BaseMessage], grammar: str | None = None, logprobs: bool = False) -> ChatResult:
        with self._lock:
            self.calls.append(list(messages))
            self.grammars.append(grammar)
            if self._index >= len(self.messages):
                raise ModelError(f"FakeToolCallingModel: scripted replies exhausted after {self._index} calls")
            reply = self.messages[self._index]
            self._index += 1
        message = reply if isinstance(reply, AIMessage) else AIMessage(content=reply)
        return ChatResult(generations=[ChatGeneration(message=message)])
