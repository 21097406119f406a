"""auto's one model-call limit: each stage runs its compiled graph within the calls the budget leaves it
(`state.calls_left`), counted by a `CallLimit` that refuses the call past the cap."""

from __future__ import annotations

import time
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.runnables import RunnableConfig

from mhqa_graph.errors import MhqaError

from ..calls import CALL_GATE


class BudgetExhausted(MhqaError):
    """auto's `budget` of model calls is spent: the stage that asked for one more stops."""


class CallLimit(BaseCallbackHandler):
    """Counts the model calls of a stage (each attempt, retries too); once `cap` (0 = none) are made, `check` raises
    BudgetExhausted. It is the stage's `CALL_GATE`, run before each call: a callback that raises stops the call too,
    but LangChain logs it as the callback's error (so the callback raises only for a retry past the cap)."""

    raise_error = True

    def __init__(self, cap: int = 0) -> None:
        self.cap, self.calls = cap, 0

    def check(self) -> None:
        if self.cap and self.calls >= self.cap:
            raise BudgetExhausted(f"auto's budget is spent ({self.cap} calls left to this stage, all made)")

    def _count(self) -> None:
        self.check()
        self.calls += 1

    def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        self._count()

    def on_llm_start(self, *args: Any, **kwargs: Any) -> None:
        self._count()


def _with_handler(config: RunnableConfig, handler: BaseCallbackHandler) -> RunnableConfig:
    callbacks = config.get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        callbacks = callbacks.copy()
        callbacks.add_handler(handler, inherit=True)
    else:
        callbacks = [*(callbacks or []), handler]
    return {**config, "callbacks": callbacks}


def run_stage(graph: Any, inputs: dict, config: RunnableConfig, context: Any, cap: int,
              output_keys: list[str] | None = None) -> tuple[dict, int, str | None]:
    """(the stage's output with its `calls` and `seconds`, the calls it made, the error that stopped it or None):
    `graph` invoked as a subgraph of the running node, within `cap` calls. A stage that raises is recorded, not
    propagated."""
    started, limit = time.perf_counter(), CallLimit(cap)
    gate = CALL_GATE.set(limit.check)  # the stage's nodes (in LangGraph's threads too) run with a copy of it
    try:
        output, error = dict(graph.invoke(inputs, _with_handler(config, limit), context=context,
                                          **({"output_keys": output_keys} if output_keys else {}))), None
    except Exception as exc:  # a stage failing is a decision to record; auto answers with what it has
        output, error = {}, f"{type(exc).__name__}: {exc}"
    finally:
        CALL_GATE.reset(gate)
    return output | {"calls": limit.calls, "seconds": round(time.perf_counter() - started, 3)}, limit.calls, error
