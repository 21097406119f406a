"""Reply formats: the shape of each role's reply, declared once and enforced by the backend where it can.

A `ReplyFormat` is one of four turns, each optionally opened by a bounded `<think>…</think>` block:
- `json`: a JSON value matching `schema` (OPERA's plan, analysis and rewrite; Mujica's planner and worker);
- `answer`: `<answer>…</answer>`, a short answer (the baselines, Omne's forced answer);
- `line`: one line of plain text, a short answer (OPERA's synthesis);
- `tool_calls`: one or more tool calls matching `schema`, in `<tool_call>` tags or bare as the protocol also
  reads them (the real 1.5B model writes bare calls, and barred from them it answers instead), or an
  `<answer>` (Omne); after the calls only `<tool_response>` may follow, where the stop sequence ends the turn.

A JSON reply is declared once, as a pydantic model (`Reply`): its schema (`json_schema`) is what a backend holds the
reply to, and its field descriptions give the format line the prompt shows (`Reply.line`).

`decoding_kwargs(model, fmt)` gives the keyword arguments that make a chat model decode the format:
a GBNF grammar for llama.cpp (`llamacpp:` specs) and for transformers models (`hf:` specs and packs, through
xgrammar when it is installed), `response_format` with a strict JSON schema for OpenAI-compatible servers
(vLLM included; JSON turns without a think block only), LangChain's `with_structured_output` for any other chat
model that implements it (`structured`; JSON turns without a think block), nothing for the others (scripted
fakes), which keep the prompt. A reply the backend held to its format is read as the model (`held`); any other goes
through the roles' tolerant parsers (their alias tables). Either way the role then judges it: a constrained reply is a
well-formed one, not a right one.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.utils.json_schema import dereference_refs
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, WithJsonSchema, create_model

THINK_CHARS = 1200  # of a think block: a small model that thinks on forever still gets to answer
CHARS_PER_TOKEN = 3  # fewest characters a token of a think block holds, about (names and symbols tokenise finely)
ANSWER_CHARS = 200  # of an <answer>: a short answer, not a paragraph
TEXT_CHARS = 300  # of a free string inside a JSON reply (a sub-question, a query, an answer)
Turn = Literal["json", "answer", "line", "tool_calls"]
Decoding = Literal["grammar", "json_schema", "structured_output", "prompt"]
DECODING_MODES = ("auto", "constrained", "prompt")


@dataclass(frozen=True)
class ReplyFormat:
    """What a reply must look like. `shape` is the model of a `json` turn's value (a `Reply`, or a union of them) or
    of one tool call (a union of the calls' models); `think` lets a `<think>` block of at most `think_chars`
    characters come first."""

    name: str
    turn: Turn = "json"
    shape: Any = None
    think: bool = False
    think_chars: int = THINK_CHARS
    answer_chars: int = ANSWER_CHARS
    max_calls: int = 1

    def think_tokens(self) -> int:
        """Tokens the think block may take, at most (0 without one): a reply's token budget is for its body,
        and a constrained reply gets this many more, so that a full think block never cuts its body short."""
        return -(-self.think_chars // CHARS_PER_TOKEN) if self.think else 0

    @functools.cached_property
    def schema(self) -> dict[str, Any]:
        """The JSON schema of the shape (`json_schema`); {} for a turn without one."""
        return json_schema(self.shape) if self.shape is not None else {}

    def parse(self, text: str) -> Any:
        """A reply decoded under this format as its model: the JSON after the think block, validated; ValueError
        when it does not match."""
        body = text.partition("</think>")[2] if self.think else text
        try:
            return TypeAdapter(self.shape).validate_json(body)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(map(str, error["loc"]))
            raise ValueError(f"the reply does not match its format: {error['msg']}{f' at {where}' if where else ''}") \
                from None

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


class Reply(BaseModel):
    """A JSON object reply, declared once: its fields' types and bounds give the JSON schema a backend holds the reply
    to (the grammar, `response_format`, `with_structured_output`), their descriptions the format line the prompt
    shows."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def line(cls, **shown: str) -> str:
        """The reply as the prompt shows it, each field by its description (a string's in quotes):
        `{"answer": "short answer", "sufficient": true or false}`; a field named in `shown` is shown so instead."""
        def how(name: str, field: dict[str, Any]) -> str:
            said = shown.get(name, field["description"])
            return f'"{said}"' if field.get("type") == "string" else said

        fields = cls.model_json_schema()["properties"]
        return "{" + ", ".join(f'"{name}": {how(name, field)}' for name, field in fields.items()) + "}"

    @classmethod
    def asked(cls, name: str, **schemas: dict[str, Any]) -> type[Reply]:
        """This reply as one call asks for it, titled `name`: a field named in `schemas` is held to that JSON schema
        (a list whose items or length, an answer whose values, depend on the call)."""
        fields: dict[str, Any] = {field: (Annotated[cls.model_fields[field].annotation, WithJsonSchema(schema)],
                                          cls.model_fields[field]) for field, schema in schemas.items()}
        return create_model(name, __base__=cls, __module__=cls.__module__, __doc__=cls.__doc__, **fields)

    @classmethod
    def reply(cls, name: str, think: bool = False, **schemas: dict[str, Any]) -> ReplyFormat:
        """The format of a reply of this model asked as `name` (see `asked`)."""
        return json_reply(name, cls.asked(name, **schemas), think=think)


# the order of a schema's keys as the reply formats are sent (a `response_format` is sent as written); others last
KEY_ORDER = {key: i for i, key in enumerate(("type", "const", "enum", "properties", "required", "additionalProperties",
                                             "items", "minItems", "maxItems", "minLength", "maxLength", "anyOf"))}


def json_schema(shape: Any) -> dict[str, Any]:
    """The JSON schema a backend holds a reply of `shape` (a model, or a union of models) to: pydantic's, references
    inlined, without titles and descriptions (the prompt shows those), keys in `KEY_ORDER`."""
    def plain(node: Any) -> Any:
        if isinstance(node, list):
            return [plain(v) for v in node]
        if not isinstance(node, dict):
            return node
        kept = {key: {name: plain(v) for name, v in value.items()} if key == "properties" else plain(value)
                for key, value in node.items() if key not in ("$defs", "title", "description")}
        return dict(sorted(kept.items(), key=lambda kv: KEY_ORDER.get(kv[0], len(KEY_ORDER))))

    return plain(dereference_refs(TypeAdapter(shape).json_schema()))


def json_reply(name: str, shape: Any, think: bool = False) -> ReplyFormat:
    return ReplyFormat(name=name, turn="json", shape=shape, think=think)


def answer_reply(name: str, think: bool = False) -> ReplyFormat:
    return ReplyFormat(name=name, turn="answer", think=think)


def line_reply(name: str, think: bool = False) -> ReplyFormat:
    return ReplyFormat(name=name, turn="line", think=think)


def tool_reply(name: str, calls: Any, think: bool = False, max_calls: int = 1) -> ReplyFormat:
    """A turn of one or more tool calls, each one of `calls` (a union of the calls' models), or an answer."""
    return ReplyFormat(name=name, turn="tool_calls", shape=calls, think=think, max_calls=max(1, max_calls))


HELD = ("grammar", "json_schema")  # a backend's `decoding` of a reply it held to the format (response_metadata)


def held(message: BaseMessage, fmt: ReplyFormat) -> Any | None:
    """`message` as `fmt`'s model when the backend held it to the format: the object a structured output gave, or a
    reply decoded under a grammar or a JSON schema that was not cut off by the token limit (`ReplyFormat.parse`).
    None for any other reply (prompt decoding, a constraint the backend dropped, the fakes): the roles' tolerant
    parsers read those."""
    if isinstance(parsed := message.additional_kwargs.get("parsed"), BaseModel):
        return parsed
    said = message.response_metadata
    if said.get("decoding") not in HELD or said.get("finish_reason") == "length":
        return None
    return fmt.parse(message.text)


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
    """`model.with_structured_output(fmt's model, include_raw=True)`, replying as the other backends do: a message
    holding the model's object (`additional_kwargs["parsed"]`, what `held` reads) with the value as JSON for its
    text, or the raw reply's text when the model's value did not parse (the role's parser reads it, and its repair
    asks again). Usage and metadata are the raw reply's. A model that cannot give this schema is asked with the
    prompt instead, as a server that refuses a `response_format` is: one whose `with_structured_output` raises
    NotImplementedError, or a call that the provider refuses (`refuses_schema`); the trace's `decoding_error` says
    why."""
    from langchain_core.messages import AIMessage
    from langchain_core.runnables import RunnableConfig, RunnableLambda

    def as_message(out: dict[str, Any]) -> AIMessage:
        raw, parsed = out.get("raw"), out.get("parsed")
        meta = dict(getattr(raw, "response_metadata", {}) or {})
        usage = getattr(raw, "usage_metadata", None)
        if isinstance(parsed, BaseModel):
            return AIMessage(json.dumps(parsed.model_dump(exclude_unset=True), ensure_ascii=False),
                             additional_kwargs={"parsed": parsed}, usage_metadata=usage, response_metadata=meta)
        return AIMessage(getattr(raw, "text", "") or "", usage_metadata=usage, response_metadata=meta)

    def prompted(why: str) -> Any:
        return model.with_config(metadata={"mhqa_decoding_fallback": why})

    try:
        constrained = model.with_structured_output(fmt.shape, include_raw=True) | RunnableLambda(as_message)
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
