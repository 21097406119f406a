"""Omne's state, settings and what it returns (the design itself is `graph`): the conversation (`add_messages`), the
tool calls run, the counters the guards and health read, and Omne's settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, NotRequired

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from mhqa_graph.errors import InvalidInput

from ..calls import supports_tool_calling
from ..settings import AgentContext, QAInput, QAOutput, setting

ROLE = "tool-agent"


@dataclass
class OmneContext(AgentContext):
    agent: ClassVar[str] = "omne"
    max_calls_per_round: int = setting(5, help="Tool calls run per model turn; further calls get an error result.")
    tool_mode: str = setting("auto", help="native: the model's own tool calling (bind_tools); text: the "
                             "<tool_call> protocol; auto: native when the model supports it.")
    result_chars: int = setting(1500, help="Characters of one tool result shown to the model (the facts most "
                                "relevant to the question first).")
    context_chars: int = setting(16000, help="Characters of the whole prompt; the oldest tool results are cut "
                                 "first to stay within it.")

    def check(self) -> None:
        model = self.role_llms.get(ROLE, self.llm)
        if self.tool_mode == "native" and isinstance(model, BaseChatModel) and not supports_tool_calling(model):
            raise InvalidInput(f"tool_mode=native: {type(model).__name__} has no native tool calling (bind_tools); "
                               "use tool_mode=text or auto")


class ToolCallRecord(TypedDict):
    name: str
    args: dict[str, Any]
    result_preview: str
    repeated: bool  # same name and normalised args as an earlier call: not run again


class OmneInput(QAInput):
    # entities whose facts the walk starts from (an earlier stage's retrieval): names, or {"entity", "graph"}
    start_from: NotRequired[list[str | dict[str, str]]]


class OmneOutput(QAOutput):
    rounds: int
    tool_calls: list[ToolCallRecord]
    repeated_calls: int
    invented_results: int
    dropped_answers: int
    guards: list[dict]
    messages: NotRequired[list[AnyMessage]]


class OmneState(TypedDict):
    question: str
    topic_entities: NotRequired[list[str]]
    start_from: NotRequired[list[str | dict[str, str]]]
    graphs: list[str]  # the graph_type values of this run
    native: bool  # the model's own tool calling, not the text protocol
    messages: Annotated[list[AnyMessage], add_messages]  # the conversation, without the system prompt
    rounds: int  # agent model turns so far (the forced final-answer call is not one)
    nudges: int  # replies with neither a tool call nor an answer, and answers sent back
    tool_calls: list[ToolCallRecord]
    repeated_calls: int
    invented_results: int  # <tool_response> blocks the model wrote itself (dropped)
    dropped_answers: int  # answers written beside tool calls (dropped: the calls run)
    guards: list[dict]  # every guard firing (graphs/guards/)
    answer: str
    error: str | None
