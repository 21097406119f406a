"""Reply formats: the shape of each role's reply, declared once and enforced by the backend where it can.

A `ReplyFormat` is one of four turns, each optionally opened by a bounded `<think>…</think>` block:
- `json`: a JSON value matching `schema` (OPERA's plan, analysis and rewrite; Mujica's planner and worker);
- `answer`: `<answer>…</answer>`, a short answer (the baselines, Omne's forced answer);
- `line`: one line of plain text, a short answer (OPERA's synthesis);
- `tool_calls`: one or more tool calls matching `schema`, in `<tool_call>` tags or bare as the protocol also
  reads them (the real 1.5B model writes bare calls, and barred from them it answers instead), or an
  `<answer>` (Omne); after the calls only `<tool_response>` may follow, where the stop sequence ends the turn.

`decoding_kwargs(model, fmt)` gives the keyword arguments that make a chat model decode the format:
a GBNF grammar for llama.cpp (`llamacpp:` specs) and for transformers models (`hf:` specs and packs, through
xgrammar when it is installed), `response_format` with a strict JSON schema for OpenAI-compatible servers
(vLLM included; JSON turns without a think block only), LangChain's `with_structured_output` for any other chat
model that implements it (`structured`; JSON turns without a think block), nothing for the others (scripted
fakes), which keep the prompt and the tolerant parser. The parsers run on every
reply either way: a constrained reply is a well-formed one, not a right one.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel

THINK_CHARS = 1200  # of a think block: a small model that thinks on forever still gets to answer
CHARS_PER_TOKEN = 3  # fewest characters a token of a think block holds, about (names and symbols tokenise finely)
ANSWER_CHARS = 200  # of an <answer>: a short answer, not a paragraph
TEXT_CHARS = 300  # of a free string inside a JSON reply (a sub-question, a query, an answer)
Turn = Literal["json", "answer", "line", "tool_calls"]
Decoding = Literal["grammar", "json_schema", "structured_output", "prompt"]
DECODING_MODES = ("auto", "constrained", "prompt")


@dataclass(frozen=True)
class ReplyFormat:
    """What a reply must look like. `schema` is the JSON schema of a `json` turn's value or of one tool
    call; `think` lets a `<think>` block of at most `think_chars` characters come first."""

    name: str
    turn: Turn = "json"
    schema: dict[str, Any] = field(default_factory=dict, hash=False)  # compared, not hashed (a dict)
    think: bool = False
    think_chars: int = THINK_CHARS
    answer_chars: int = ANSWER_CHARS
    max_calls: int = 1

    def think_tokens(self) -> int:
        """Tokens the think block may take, at most (0 without one): a reply's token budget is for its body,
        and a constrained reply gets this many more, so that a full think block never cuts its body short."""
        return -(-self.think_chars // CHARS_PER_TOKEN) if self.think else 0

    def gbnf(self) -> str:
        """The format as a llama.cpp grammar (GBNF)."""
        rules = [f"root ::= {'reply-think ' if self.think else ''}reply-body"]
        if self.think:
            rules += [f'reply-think ::= "<think>" [^<]{{0,{self.think_chars}}} "</think>" [ \\t\\n]{{0,2}}']
        answer = f'"<answer>" [^<\\n]{{1,{self.answer_chars}}} "</answer>"'
        if self.turn == "answer":
            rules += [f"reply-body ::= {answer}"]
        elif self.turn == "line":
            rules += [f"reply-body ::= [^<\\n]{{1,{self.answer_chars}}}"]
        elif self.turn == "json":
            rules += ["reply-body ::= json-root", *_schema_rules(json.dumps(self.schema, sort_keys=True))]
        else:
            extra = f' ("\\n" reply-call){{0,{self.max_calls - 1}}}' if self.max_calls > 1 else ""
            # after its calls the model may open the result it waits for: the stop sequence ends the turn there
            rules += [f'reply-body ::= reply-call{extra} ("\\n"? "<tool_response>")? | {answer}',
                      'reply-call ::= "<tool_call>\\n" json-root "\\n</tool_call>" | json-root',
                      *_schema_rules(json.dumps(self.schema, sort_keys=True))]
        return "\n".join(rules) + "\n"

    def response_format(self) -> dict[str, Any] | None:
        """OpenAI's `response_format` for a JSON turn without a think block whose root is an object (strict
        schemas must be); None for any other turn."""
        if self.turn != "json" or self.think or self.schema.get("type") != "object":
            return None
        return {"type": "json_schema", "json_schema": {"name": self.name, "schema": self.schema, "strict": True}}


# a character of a JSON string: llama-cpp-python's converter lets raw control characters through, which
# JSON forbids (json.loads rejects them), so a constrained reply could still fail to parse
JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'


@functools.lru_cache(maxsize=256)
def _schema_rules(schema: str) -> tuple[str, ...]:
    """The GBNF rules of a JSON schema given as JSON text, with its root renamed `json-root`, run once per schema
    (the agents ask for the same formats on every call): llama.cpp's own converter where llama-cpp-python is
    installed, else xgrammar's (the `train` extra alone: the policy's processor is xgrammar's, which reads its own
    rules). The agents' schemas are not recursive, so nothing else refers to the root."""
    if importlib.util.find_spec("llama_cpp") is not None:
        rules = [JSON_CHAR if r.startswith("char ::=") else r for r in _llama_gbnf(schema).splitlines() if r.strip()]
    else:
        import xgrammar as xgr

        rules = [r for r in str(xgr.Grammar.from_json_schema(schema, any_whitespace=False)).splitlines() if r.strip()]
    rules = [re.sub(r"^root ::=", "json-root ::=", r) for r in rules]
    clash = [r for r in rules if re.match(r"(reply-[\w-]*|json-root) ::=", r) and not r.startswith("json-root ::=")]
    if clash or sum(r.startswith("json-root ::=") for r in rules) != 1:
        raise ValueError(f"the schema's grammar rules clash with the reply's own: {clash[:2]}")
    return tuple(rules)


def _llama_gbnf(schema: str) -> str:
    """llama-cpp-python's `json_schema_to_gbnf`, with a backslash in a literal escaped: its converter leaves it as it
    is, so a value holding a quote (a title written `"Never Be the Same`, JSON `\\"`) ended the literal early and
    llama.cpp rejected the whole grammar (the call then went unconstrained). A constant's letters stay as they are
    ("Zürich", not `\\u00fc`, which the escaped backslash would otherwise ask the model to write)."""
    from llama_cpp.llama_grammar import SchemaConverter

    class Converter(SchemaConverter):
        def _format_literal(self, literal: str) -> str:
            escaped = literal.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
            return f'"{escaped}"'

        def _generate_constant_rule(self, value: Any) -> str:
            return self._format_literal(json.dumps(value, ensure_ascii=False))

    converter = Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    converter.visit(converter.resolve_refs(json.loads(schema), "stdin"), "")
    return converter.format_grammar()


# -- schemas ---------------------------------------------------------------------------------
def text(max_chars: int = TEXT_CHARS, min_chars: int = 1) -> dict[str, Any]:
    return {"type": "string", "minLength": min_chars, "maxLength": max_chars}


def obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """A JSON object with exactly these properties (all required unless `required` says otherwise)."""
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required, "additionalProperties": False}


@dataclass(frozen=True)
class Shape:
    """A JSON object reply declared once: each field's name, JSON schema and how the prompt shows it. From it come
    the schema (so the grammar and `response_format`) and the format line the prompt asks for."""

    fields: tuple[tuple[str, dict[str, Any], str], ...]  # (name, schema, shown as: '"short answer"', 'true or false')

    def schema(self, omit: tuple[str, ...] = (), **given: dict[str, Any]) -> dict[str, Any]:
        """The object's JSON schema, every field required, without the fields in `omit`; a field named in `given`
        takes that schema for this reply (a list whose items or length depend on the call)."""
        return obj({name: given.get(name, schema) for name, schema, _ in self.fields if name not in omit})

    def line(self, omit: tuple[str, ...] = (), shown: dict[str, str] | None = None) -> str:
        """The reply as the prompt shows it: `{"answer": "short answer", "sufficient": true or false}`; a field named
        in `shown` is shown that way in this prompt."""
        shown = shown or {}
        return "{" + ", ".join(f'"{name}": {shown.get(name, how)}' for name, _, how in self.fields
                               if name not in omit) + "}"

    def reply(self, name: str, omit: tuple[str, ...] = (), think: bool = False, **given: dict[str, Any]) -> ReplyFormat:
        return json_reply(name, self.schema(omit, **given), think=think)


def json_reply(name: str, schema: dict[str, Any], think: bool = False) -> ReplyFormat:
    return ReplyFormat(name=name, turn="json", schema=schema, think=think)


def answer_reply(name: str, think: bool = False) -> ReplyFormat:
    return ReplyFormat(name=name, turn="answer", think=think)


def line_reply(name: str, think: bool = False) -> ReplyFormat:
    return ReplyFormat(name=name, turn="line", think=think)


def tool_reply(name: str, call_schemas: list[dict[str, Any]], think: bool = False, max_calls: int = 1) -> ReplyFormat:
    return ReplyFormat(name=name, turn="tool_calls", schema={"anyOf": call_schemas}, think=think,
                       max_calls=max(1, max_calls))


# -- backends --------------------------------------------------------------------------------
def backend_decoding(model: BaseChatModel) -> Decoding:
    """How `model` can constrain a reply: "grammar" (llama.cpp, and fakes that play one), "json_schema"
    (OpenAI-compatible servers), "structured_output" (any other LangChain chat model that implements
    `with_structured_output`: Anthropic, Gemini, Mistral, ...), else "prompt". A RecordingChatModel answers for the
    model it records."""
    inner = getattr(model, "inner", None)  # RecordingChatModel passes kwargs through to the model it records
    if isinstance(inner, BaseChatModel):
        return backend_decoding(inner)
    if getattr(model, "accepts_grammar", False):
        return "grammar"
    if type(model).__module__.startswith("langchain_openai"):
        return "json_schema"
    own = type(model).with_structured_output is not BaseChatModel.with_structured_output
    return "structured_output" if own else "prompt"


def decoding_kwargs(model: BaseChatModel, fmt: ReplyFormat) -> tuple[dict[str, Any], Decoding]:
    """(the invoke kwargs that constrain `model` to `fmt`, how): a `grammar` for llama.cpp, a
    `response_format` for OpenAI-compatible servers, else ({}, "prompt")."""
    how = backend_decoding(model)
    if how == "grammar":
        return {"grammar": fmt.gbnf()}, "grammar"
    if how == "json_schema" and (response_format := fmt.response_format()):
        return {"response_format": response_format}, "json_schema"
    if how == "structured_output" and fmt.response_format():  # a JSON object without a think block
        return {}, "structured_output"
    return {}, "prompt"


def structured(model: BaseChatModel, fmt: ReplyFormat) -> Any:
    """`model.with_structured_output(fmt's schema, include_raw=True)`, replying as the other backends do: a message
    whose text is the value as JSON (the parsers read it as any reply), or the raw reply's text when the model's
    value did not parse (the agent's repair then asks again). Usage and metadata are the raw reply's. A model that
    cannot give this schema is asked with the prompt instead, as a server that refuses a `response_format` is: one
    whose `with_structured_output` raises NotImplementedError, or a call that the provider refuses
    (`refuses_schema`); the trace's `decoding_error` says why."""
    from langchain_core.messages import AIMessage
    from langchain_core.runnables import RunnableConfig, RunnableLambda

    schema = {"title": fmt.name, "description": f"The {fmt.name} reply.", **fmt.schema}

    def as_message(out: dict[str, Any]) -> AIMessage:
        raw = out.get("raw")
        parsed = out.get("parsed")
        text = json.dumps(parsed, ensure_ascii=False) if isinstance(parsed, dict) else getattr(raw, "text", "") or ""
        meta = dict(getattr(raw, "response_metadata", {}) or {})
        return AIMessage(text, usage_metadata=getattr(raw, "usage_metadata", None), response_metadata=meta)

    def prompted(why: str) -> Any:
        return model.with_config(metadata={"mhqa_decoding_fallback": why})

    try:
        constrained = model.with_structured_output(schema, include_raw=True) | RunnableLambda(as_message)
    except NotImplementedError as exc:
        return prompted(f"{type(model).__name__} has no structured output for this schema ({exc})"[:300])

    def call(messages: Any, config: RunnableConfig, **kwargs: Any) -> Any:
        try:
            return constrained.invoke(messages, config, **kwargs)
        except Exception as exc:
            if not refuses_schema(exc):
                raise
            return prompted(f"the provider refused the schema: {type(exc).__name__}").invoke(messages, config, **kwargs)

    async def acall(messages: Any, config: RunnableConfig, **kwargs: Any) -> Any:
        try:
            return await constrained.ainvoke(messages, config, **kwargs)
        except Exception as exc:
            if not refuses_schema(exc):
                raise
            why = f"the provider refused the schema: {type(exc).__name__}"
            return await prompted(why).ainvoke(messages, config, **kwargs)

    return RunnableLambda(call, afunc=acall, name="structured_output")


def refuses_schema(exc: BaseException) -> bool:
    """Whether a structured-output call failed because the model or its provider cannot give the schema:
    NotImplementedError, or a bad request (HTTP 400, as providers' clients raise it)."""
    status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
    return isinstance(exc, NotImplementedError) or status == 400


def can_constrain(spec: Any) -> bool:
    """Whether a model spec (or chat model object) names a backend that `decoding_kwargs` can constrain."""
    if isinstance(spec, BaseChatModel):
        return backend_decoding(spec) != "prompt"
    if not isinstance(spec, str):
        return False
    if spec.startswith(("llamacpp:", "openai:")):
        return True
    from mhqa_graph.models.grammar import available
    from mhqa_graph.models.packs import PACKS

    return (spec.startswith("hf:") or spec in PACKS) and available()  # transformers, through xgrammar
