"""Prompts of the Omne tool agent: Qwen2.5-style text tool calls over a schema-free knowledge graph."""

# Tool signatures shown to the model; omne.py fills the graph_type enum with the graphs of the run.
TOOL_SPECS = [
    {
        "name": "entity_matcher",
        "description": "Find the entities of a knowledge graph whose names best match a query (semantic + "
                       "lexical). Returns exact entity names, best first. Use it to locate the starting "
                       "entity before calling node_info.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "an entity name or short description"},
                "graph_type": {"type": "string", "description": "the knowledge graph to search"},
            },
            "required": ["query", "graph_type"],
        },
    },
    {
        "name": "node_info",
        "description": "All facts about one entity of a knowledge graph: its outgoing and incoming relations "
                       "to neighbouring entities. Use an exact name returned by entity_matcher or seen in "
                       "an earlier fact.",
        "parameters": {
            "type": "object",
            "properties": {
                "entity": {"type": "string", "description": "the exact entity name"},
                "graph_type": {"type": "string", "description": "the knowledge graph to search"},
            },
            "required": ["entity", "graph_type"],
        },
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
You may make several calls in one turn. The results come back inside <tool_response></tool_response> tags.

# How to work

Start with entity_matcher to find the exact name of the entity the question starts from, then follow the \
relations with node_info, hop by hop, until you reach the answer. Do not repeat a call you have already made: \
its result is above. When you know the answer, write it inside <answer></answer> tags: a short entity name \
or phrase, not a sentence.
{think}"""

THINK_ON = ("Each turn, first reason briefly inside <think></think> tags about what you know and what to look "
            "up next, then write either your tool call(s) or your answer.")
THINK_OFF = "Do not write your reasoning: each turn, write only your tool call(s) or your answer."

QUESTION = "Question: {question}"
TOPIC_ENTITIES = "Entities the question is about: {entities}"

NUDGE = ("Your reply had neither a tool call nor an answer. Continue: call a tool inside "
         "<tool_call></tool_call> tags, or give your final answer inside <answer></answer> tags.")

REPEATED = ("You already called {name} with these arguments; the result is in an earlier <tool_response>. "
            "Use it, call a tool with different arguments, or answer.")

TOO_MANY_CALLS = "Error: at most {limit} tool calls per turn; this call was not run. Make it in your next turn."

FORCE_ANSWER = ("You cannot call tools any more. Using only what you have found so far (and your own knowledge "
                "where the facts are missing), give your best final answer now inside <answer></answer> tags.")
