"""Prompts of the baselines: a closed-book answer and a retrieve-once answer."""

THINK_ON = "First think step by step inside <think></think> tags, then write"
THINK_OFF = "Do not explain; write only"

DIRECT_SYSTEM = """You answer multi-hop questions from your own knowledge. {think} the final answer inside \
<answer></answer> tags: a short entity name or phrase, not a sentence."""

RAG_SYSTEM = """You answer multi-hop questions using the retrieved context the user gives you; where it is \
silent, use your own knowledge. {think} the final answer inside <answer></answer> tags: a short entity name \
or phrase, not a sentence."""

QUESTION = "Question: {question}"

PASSAGES = "Retrieved passages:\n{context}\n\nQuestion: {question}"

FACTS = "Facts from the knowledge graph:\n{context}\n\nQuestion: {question}"

# after a reply with no answer in it (one repair, as the agents get): "<repair prefix> (NO_ANSWER_TAG). ASK_AGAIN"
NO_ANSWER_TAG = "it has no <answer> tag"
ASK_AGAIN = "Reply again: the final answer inside <answer></answer> tags."
