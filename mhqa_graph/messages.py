"""What a message a design sends the model is, said beside its text (`additional_kwargs["mhqa_kind"]`), so that
traces, health and export read the kind instead of matching prompt text.

    repair        a reply could not be used; asked again (structured-output repair)
    nudge         a reply had neither a tool call nor an answer (Omne)
    send_back     an answer sent back with facts to use (Omne's guards)
    forced        a cap was reached: answer now; the conversation so far stands (Mujica's last planner turn)
    forced_final  the tools are over: answer now; a reply just before it was not used (Omne's final call)
    handed_over   a tool call the system wrote in the model's place, from an earlier stage's retrieval (auto's
                  hand-over to Omne): the model's turn, not the model's words

A trace keeps the kind on each chat message (`traces.ChatMessage.kind`). Traces written before kinds existed
have none; readers then fall back to the designs' marker texts (`legacy_kind`, imported only when needed).
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage

KIND = "mhqa_kind"
REPAIR, NUDGE, SEND_BACK, FORCED, FORCED_FINAL = "repair", "nudge", "send_back", "forced", "forced_final"
HANDED_OVER = "handed_over"
KINDS = (REPAIR, NUDGE, SEND_BACK, FORCED, FORCED_FINAL, HANDED_OVER)
RETRIES = (REPAIR, NUDGE, SEND_BACK)  # asks again: the reply before such a message was not used
FORCES = (FORCED, FORCED_FINAL)  # answer now


def tagged(kind: str, text: str) -> HumanMessage:
    """A user message of `kind` (one of KINDS)."""
    if kind not in KINDS:
        raise ValueError(f"unknown message kind {kind!r}")
    return HumanMessage(text, additional_kwargs={KIND: kind})


def marked(kind: str, message: BaseMessage) -> BaseMessage:
    """`message` (any role) tagged with `kind` (one of KINDS)."""
    if kind not in KINDS:
        raise ValueError(f"unknown message kind {kind!r}")
    return message.model_copy(update={"additional_kwargs": {**message.additional_kwargs, KIND: kind}})


def kind_of(message: BaseMessage) -> str | None:
    """The kind a message was tagged with, if any."""
    kind = message.additional_kwargs.get(KIND)
    return kind if kind in KINDS else None


def legacy_kind(text: str) -> str | None:
    """The kind of an untagged message (a trace written before kinds), from the designs' marker texts."""
    from .graphs.calls import REPAIR_PREFIX
    from .graphs.mujica.prompts import NO_MORE
    from .graphs.omne.prompts import FORCE_ANSWER, is_send_back
    from .graphs.omne.prompts import NUDGE as NUDGE_TEXT

    if text.startswith(REPAIR_PREFIX):
        return REPAIR
    if text == NUDGE_TEXT:
        return NUDGE
    if is_send_back(text):
        return SEND_BACK
    if text == FORCE_ANSWER:
        return FORCED_FINAL
    if NO_MORE in text:
        return FORCED
    return None


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def kind_in_trace(message: Any, tagged_trace: bool) -> str | None:
    """The kind of a trace's chat message (a `ChatMessage` or its JSON form). A trace that records kinds
    (`Trace.kinds`) is read as tagged; an older one by its marker texts (`legacy_kind`, user messages only)."""
    if tagged_trace:
        return _get(message, "kind")
    return None if _get(message, "role") == "assistant" else legacy_kind(_get(message, "content") or "")


def last_kind(call: Any, tagged_trace: bool) -> str | None:
    """The kind of the message an LLM call answered (its last non-assistant message): a repair, nudge, send-back,
    forced. `call` is a trace's `LLMCall` or its JSON form in an eval record."""
    answered = next((m for m in reversed(_get(call, "messages") or []) if _get(m, "role") != "assistant"), {})
    return kind_in_trace(answered, tagged_trace)
