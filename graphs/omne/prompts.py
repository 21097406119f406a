"""Prompts of the Omne tool agent: Qwen2.5-style text tool calls over a schema-free knowledge graph."""

import re

from mhqa_graph.replies import Reply, ReplyFormat, json_schema, text, tool_reply

from .replies import EntityMatcherArguments, EntityMatcherCall, NodeInfoArguments, NodeInfoCall


def parameters(arguments: type[Reply]) -> dict:
    """A tool's parameters as its signature shows them: each argument of its reply model, a string with the
    model's description of it."""
    fields = arguments.model_fields
    return {"type": "object", "properties": {name: {"type": "string", "description": f.description}
                                             for name, f in fields.items()}, "required": list(fields)}

# Tool signatures shown to the model; omne.py fills the graph_type enum with the graphs of the run.
TOOL_SPECS = [
    {
        "name": "entity_matcher",
        "description": "Find the entities of a knowledge graph whose names best match a query (semantic + "
                       "lexical). Returns exact entity names, best first. Use it to locate the starting "
                       "entity before calling node_info.",
        "parameters": parameters(EntityMatcherArguments),
    },
    {
        "name": "node_info",
        "description": "All facts about one entity of a knowledge graph: its outgoing and incoming relations "
                       "to neighbouring entities. Use an exact name returned by entity_matcher or seen in "
                       "an earlier fact.",
        "parameters": parameters(NodeInfoArguments),
    },
]

SYSTEM = """You answer multi-hop questions by exploring a knowledge graph, one hop at a time.

Knowledge graphs you can search (the graph_type argument): {graph_types}

# Tools

You are given function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

To call a function, write a JSON object with the function name and arguments inside <tool_call></tool_call> tags:
<tool_call>
{{"name": "<function-name>", "arguments": <args-json-object>}}
</tool_call>
Then stop: the system runs the call and sends you its result inside <tool_response></tool_response> tags in \
the next message. Never write <tool_response> yourself and never guess a result.

# How to work

Start with entity_matcher to find the exact name of the entity the question starts from, then follow the \
relations with node_info, hop by hop, until you reach the answer. Do not repeat a call you have already made: \
its result is above. When the facts you were sent give the answer, write it inside <answer></answer> tags: \
a short entity name or phrase, not a sentence.
{think}

# Example (another graph)

Question: Where was the director of Alpha Film born?
You: {example_think1}<tool_call>
{{"name": "node_info", "arguments": {{"entity": "alpha film", "graph_type": "demo"}}}}
</tool_call>
System: <tool_response>
Entity: alpha film
- (alpha film) -[directed by]-> (jane roe)
</tool_response>
You: {example_think2}<tool_call>
{{"name": "node_info", "arguments": {{"entity": "jane roe", "graph_type": "demo"}}}}
</tool_call>
System: <tool_response>
Entity: jane roe
- (jane roe) -[place of birth]-> (lyon)
</tool_response>
You: {example_think3}<answer>lyon</answer>"""

EXAMPLE_THINKS = ("<think>The question names alpha film; I need its director.</think>\n",
                  "<think>The director is jane roe; now her place of birth.</think>\n",
                  "<think>jane roe was born in lyon.</think>\n")

# where generation stops: a result is the system's to write
STOP = ["<tool_response>"]

THINK_ON = ("Each turn, first reason briefly inside <think></think> tags about what you know and what to look "
            "up next, then write either your tool call(s) or your answer.")
THINK_OFF = "Do not write your reasoning: each turn, write only your tool call(s) or your answer."

QUESTION = "Question: {question}"
TOPIC_ENTITIES = "Entities the question is about: {entities}"

NUDGE = ("Your reply had neither a tool call nor an answer. Continue: call a tool inside "
         "<tool_call></tool_call> tags and stop (the system sends the result), or give your final answer "
         "inside <answer></answer> tags.")

UNGROUNDED = ("Your answer {answer!r} is not in any fact you were sent. Answer only from the facts: continue with "
              "node_info, hop by hop, until a fact gives what the question asks for, then answer.")

UNGROUNDED_FACTS = ("Your answer {answer!r} is not in any fact you were sent. The facts of {entity!r}, where the "
                    "question starts:\n<tool_response>\n{facts}\n</tool_response>\nContinue from them with node_info, "
                    "hop by hop, until a fact gives what the question asks for, then answer.")

ONE_HOP_SHORT = ("{entity!r} is not the final answer: the question asks for its {relations}. Its facts:\n"
                 "<tool_response>\n{facts}\n</tool_response>\nAnswer with what the question asks for, inside "
                 "<answer></answer> tags, or call a tool.")


def _pattern(template: str) -> re.Pattern:
    """A regex matching every text `template.format(...)` can give."""
    return re.compile(".+?".join(re.escape(p) for p in re.split(r"\{\w+(?:![rsa])?\}", template)) + r"\Z", re.DOTALL)


_SEND_BACKS = (_pattern(UNGROUNDED), _pattern(UNGROUNDED_FACTS), _pattern(ONE_HOP_SHORT))


def is_send_back(text: str) -> bool:
    """Whether `text` is a message that sent an answer back (UNGROUNDED, UNGROUNDED_FACTS, ONE_HOP_SHORT)."""
    return any(p.match(text) for p in _SEND_BACKS)


REPEATED = ("You already called {name} with these arguments; the result is in an earlier <tool_response>. "
            "Use it, call a tool with different arguments, or answer.")

TOO_MANY_CALLS = "Error: at most {limit} tool calls per turn; this call was not run. Make it in your next turn."

RESULT_CUT = "[an earlier result, cut to fit the context: {head}...]"

FORCE_ANSWER = ("You cannot call tools any more. Using only what you have found so far (and your own knowledge "
                "where the facts are missing), give your best final answer now inside <answer></answer> tags.")

NATIVE_SYSTEM = """You answer multi-hop questions by exploring a knowledge graph, one hop at a time, with the \
tools entity_matcher and node_info.

Knowledge graphs you can search (the graph_type argument): {graph_types}

Start with entity_matcher to find the exact name of the entity the question starts from, then follow the \
relations with node_info, hop by hop, until you reach the answer. Do not repeat a call. When the facts give the \
answer, reply without a tool call, with the answer inside <answer></answer> tags: a short entity name or phrase."""


# -- reply format (mhqa_graph.replies): a constrained backend lets the model write a call or an answer -----
def tool_format(graphs: list[str], think: bool, max_calls: int) -> ReplyFormat:
    """One or more <tool_call> blocks of the two tools (graph_type among the run's graphs), or an <answer>."""
    graph = {"type": "string", "enum": list(graphs)} if graphs else text()

    def asked(call: type[Reply]) -> type[Reply]:  # the call with graph_type among the run's graphs
        arguments = call.model_fields["arguments"].annotation
        return call.asked(call.__name__, arguments=json_schema(arguments.asked(arguments.__name__, graph_type=graph)))

    return tool_reply("tool-agent", asked(EntityMatcherCall) | asked(NodeInfoCall), think=think, max_calls=max_calls)
