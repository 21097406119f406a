"""A time limit on each call of any chat model: the call runs in a daemon thread and the caller stops
waiting after `seconds` with a TimeoutError (transient: `get_llm` retries it). A thread cannot be killed;
instead the call sees `ABANDONED`, an event set when the caller stops waiting, so a model that generates in
this process (llama.cpp, transformers) stops at its next token and frees itself for the retry. Any other
stalled call goes on in the background, and its reply, if one ever comes, is dropped."""

from __future__ import annotations

import contextvars
import threading
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig

ABANDONED: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("abandoned", default=None)


def raise_if_abandoned(event: threading.Event | None, name: str) -> None:
    """TimeoutError when `event` (the call's `ABANDONED`) is set: the caller left before the call began."""
    if event is not None and event.is_set():
        raise TimeoutError(f"{name}: the caller stopped waiting before the call began (model_timeout)")


class TimeLimited(Runnable):
    """`bound`, whose calls raise TimeoutError after `seconds`."""

    def __init__(self, bound: Runnable, seconds: float) -> None:
        self.bound = bound
        self.seconds = seconds

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        outcome: dict[str, Any] = {}
        done, abandoned = threading.Event(), threading.Event()
        context = contextvars.copy_context()  # callbacks and tracing see the caller's run

        def bound() -> Any:
            ABANDONED.set(abandoned)
            return self.bound.invoke(input, config, **kwargs)

        def call() -> None:
            try:
                outcome["value"] = context.run(bound)
            except BaseException as exc:  # re-raised in the caller's thread
                outcome["error"] = exc
            finally:
                done.set()

        threading.Thread(target=call, name="model-call", daemon=True).start()
        if not done.wait(self.seconds):
            abandoned.set()
            raise TimeoutError(f"the model gave no reply within {self.seconds:g} s (model_timeout)")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]
