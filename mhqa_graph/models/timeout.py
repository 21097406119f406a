"""A time limit on each call of any chat model: the call runs in a daemon thread and the caller stops
waiting after `seconds` with a TimeoutError (transient: `get_llm` retries it). A thread cannot be killed,
so a stalled call goes on in the background and its reply, if one ever comes, is dropped."""

from __future__ import annotations

import contextvars
import threading
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig


class TimeLimited(Runnable):
    """`bound`, whose calls raise TimeoutError after `seconds`."""

    def __init__(self, bound: Runnable, seconds: float) -> None:
        self.bound = bound
        self.seconds = seconds

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        outcome: dict[str, Any] = {}
        done = threading.Event()
        context = contextvars.copy_context()  # callbacks and tracing see the caller's run

        def call() -> None:
            try:
                outcome["value"] = context.run(self.bound.invoke, input, config, **kwargs)
            except BaseException as exc:  # re-raised in the caller's thread
                outcome["error"] = exc
            finally:
                done.set()

        threading.Thread(target=call, name="model-call", daemon=True).start()
        if not done.wait(self.seconds):
            raise TimeoutError(f"the model gave no reply within {self.seconds:g} s (model_timeout)")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]
