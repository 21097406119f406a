"""Token log-probabilities of a reply, and the model's confidence in its answer read from them.

A backend that gives them puts them in the reply's `response_metadata["logprobs"]` in OpenAI's shape,
`{"content": [{"token": "Par", "logprob": -0.01}, ...]}`: OpenAI-compatible servers (vLLM, llama-server) when
asked with `logprobs=True`, and `LlamaCppChatModel`, which records them with `TokenLogprobs`. They are the
model's own probabilities, before any grammar narrowed the choice.
"""

from __future__ import annotations

import math
from typing import Any

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"


class TokenLogprobs:
    """A llama.cpp logits processor that records the log-probability of each generated token under the model's
    own distribution. It sees the logits of step t before sampling and the chosen token at step t+1 (as the last
    input id), so the last token of a reply is not recorded (the end of the reply: an end token, or the close
    of a grammar's last tag)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self._pending: Any = None  # the log-softmax of the step before

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import numpy as np

        if self._pending is not None and len(input_ids):
            token = int(input_ids[-1])
            self.ids.append(token)
            self.logprobs.append(float(self._pending[token]))
        top = float(np.max(scores))
        self._pending = scores - (top + math.log(float(np.sum(np.exp(scores - top)))))
        return scores

    def content(self, detokenize: Any) -> list[dict[str, Any]]:
        """The recorded tokens in OpenAI's shape; `detokenize(id) -> bytes`."""
        return [{"token": detokenize(i).decode("utf-8", "replace"), "logprob": round(lp, 4)}
                for i, lp in zip(self.ids, self.logprobs)]


def token_logprobs(message: Any) -> list[dict[str, Any]] | None:
    """The reply's tokens with their log-probabilities ([{token, logprob}]), None when the backend gave none."""
    meta = getattr(message, "response_metadata", None) or {}
    content = (meta.get("logprobs") or {}).get("content") if isinstance(meta.get("logprobs"), dict) else None
    return content if isinstance(content, list) and content else None


def answer_logprobs(message: Any) -> list[float] | None:
    """The log-probabilities of the tokens inside the reply's `<answer>…</answer>` (a token counts when it holds
    part of the answer); None when the backend gave none or the reply has no answer tag."""
    tokens = token_logprobs(message)
    if tokens is None:
        return None
    text = "".join(t.get("token") or "" for t in tokens)
    start = text.rfind(ANSWER_OPEN)
    if start < 0:
        return None
    start += len(ANSWER_OPEN)
    end = text.find(ANSWER_CLOSE, start)
    end = len(text) if end < 0 else end
    found, at = [], 0
    for t in tokens:
        piece = t.get("token") or ""
        if at < end and at + len(piece) > start and piece.strip("<>/ ") and isinstance(t.get("logprob"), int | float):
            found.append(float(t["logprob"]))
        at += len(piece)
    return found or None


def confidence(logprobs: list[float] | None) -> float | None:
    """The probability of the answer's least likely token (FLARE's signal); None without log-probabilities."""
    return round(math.exp(min(logprobs)), 4) if logprobs else None
