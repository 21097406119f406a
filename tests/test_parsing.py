"""Tolerant parsing of small-model output."""

import pytest

from mhqa_graph.parsing import close_json, extract_json, extract_tag, final_answer, strip_think, think_text


@pytest.mark.parametrize("text, want", [
    ('{"a": 1}', {"a": 1}),
    ('Sure! Here it is:\n```json\n{"a": [1, 2]}\n```\nDone.', {"a": [1, 2]}),
    ("prose {'a': 'single quotes'} more", {"a": "single quotes"}),
    ('{"a": 1,}', {"a": 1}),
    ('<think>{"not": "this"}</think>{"a": 2}', {"a": 2}),
    ('{"a": "text with } brace", "b": [1]}', {"a": "text with } brace", "b": [1]}),
])
def test_extract_json(text, want):
    assert extract_json(text) == want


@pytest.mark.parametrize("text", ["", "no json here", "{broken: ", "}{", '{"a": 1] junk'])
def test_extract_json_gives_none(text):
    assert extract_json(text, dict) is None or isinstance(extract_json(text, dict), dict)
    assert extract_json(text, list) is None or isinstance(extract_json(text, list), list)


def test_truncated_json_is_not_guessed():
    """A reply cut off mid-value may be incomplete: callers ask again (or close it on purpose)."""
    assert extract_json('{"subgoals": ["one", "tw', dict) is None


def test_close_json():
    assert close_json('x {"a": {"b": "c') == '{"a": {"b": "c"}}'
    assert close_json('{"a": 1} tail') == '{"a": 1}'
    assert close_json("no brackets") == "no brackets"


def test_close_json_finished_keeps_the_complete_items():
    assert close_json('{"subgoals": ["a", "b", "c', finished=True) == '{"subgoals": ["a", "b"]}'
    assert close_json('```json\n{"subgoals": ["a", "b",', finished=True) == '{"subgoals": ["a", "b"]}'
    escaped = '{"subgoals": ["a", "say \\"b\\"", "c \\"d'
    assert close_json(escaped, finished=True) == '{"subgoals": ["a", "say \\"b\\""]}'
    assert close_json('{"a": [1]} tail', finished=True) == '{"a": [1]}'
    assert close_json("no brackets", finished=True) == "no brackets"


def test_tags_and_think():
    assert extract_tag("<answer>Paris</answer> <answer>Lyon", "answer") == "Lyon"
    assert extract_tag("nothing", "answer") is None
    assert strip_think("<think>hmm</think> Paris") == "Paris"
    assert strip_think("<think>never closed") == ""
    assert think_text("<think>a</think>x<think>b</think>") == "a\nb"


@pytest.mark.parametrize("text, want", [
    ("<think>reasoning</think><answer>Tulsa</answer>", "Tulsa"),
    ("<think>1. The passage says...\nTherefore, the answer is:\nRed Herring", "Red Herring"),
    ("<think>so the answer is: 1968", "1968"),
    ("reasoning...\nAnswer: Barclays Premier League", "Barclays Premier League"),
    ("<think></think>\nJörgen Smit was a teacher.\n<answer></answer>", "Jörgen Smit was a teacher."),
    ("Paris", "Paris"),
])
def test_final_answer(text, want):
    assert final_answer(text).strip() == want


def test_doubled_braces_do_not_crash_the_parser():
    """A model copying str.format-escaped JSON writes {{...}} (to Python, a set of dicts): the parser
    goes on to the next balanced span instead of raising TypeError."""
    text = '{{"subquestions": [{{"id": "q4", "depends_on": ["q3"]}}]}}'
    assert extract_json(text) == {"id": "q4", "depends_on": ["q3"]}


def test_prompts_sent_unformatted_show_single_braces():
    from mhqa_graph.graphs.mujica import prompts as mujica_prompts

    planner = mujica_prompts.PLANNER_SYSTEM
    assert "{{" not in planner and '{"subquestions": [{"id": "q1"' in planner


@pytest.mark.parametrize("text, want", [
    # a worker reply of the real model (2Wiki KG): the think block is never closed
    ('<think>\nThe context that provides this is:\n[1] (Liu Xuan) -[father]-> (Liu Shan)\nSo the answer is Liu Shan.\n'
     '{"relevant": [1], "answer": "Liu Shan"}', {"relevant": [1], "answer": "Liu Shan"}),
    ('<think>a plan: {"subquestions": [{"id": "q1", "depends_on": []}, {"id": "q2", "depends_on": ["q1"]}]} ok',
     {"subquestions": [{"id": "q1", "depends_on": []}, {"id": "q2", "depends_on": ["q1"]}]}),
    ('<think>first {"answer": "draft"} then {"answer": "final"}', {"answer": "final"}),
])
def test_a_think_block_never_closed_gives_its_last_json(text, want):
    assert extract_json(text, dict) == want


def test_json_after_a_closed_think_block_comes_first():
    assert extract_json('<think>{"answer": "draft"}</think>{"answer": "final"}', dict) == {"answer": "final"}
    assert extract_json('<think>{"answer": "draft"}</think> no json', dict) is None  # prose ends the reply
    assert extract_json('<think>{"answer": "a"}</think> <think>no json</think>', dict) is None  # not in the last
    assert extract_json("<think>no json at all", dict) is None
    assert extract_json("<think>no json</think>\n", dict) is None


def test_json_that_closes_the_last_think_block_is_the_reply():
    """A worker reply of the real model (PQ-2H): the JSON is written just before </think>, nothing after."""
    text = ("<think>\nFrom Context 1, Claudius's parent is Nero Claudius Drusus.\n\nTherefore, the answer to the "
            'question "What is the name of Claudius\'s father? " is Nero Claudius Drusus.\n\n'
            '{"relevant": [1], "answer": "Nero Claudius Drusus"}\n</think>')
    assert extract_json(text, dict) == {"relevant": [1], "answer": "Nero Claudius Drusus"}
    assert extract_json('<think>x {"answer": "draft"} y {"answer": "last"}</think>  ', dict) == {"answer": "last"}


def test_fact_ends_reads_back_the_fact_lines_agents_are_shown():
    from mhqa_graph.types import Fact, NodeInfo, fact_ends
    info = NodeInfo("kg", "Paris", [Fact("capital of", "France", "out"), Fact("born in", "Marie (a) Curie", "in")])
    assert fact_ends(info.as_text()) == ["Paris", "France", "Marie (a) Curie"]
    assert fact_ends("\n".join(f.as_text("Paris") for f in info.facts)) == ["Paris", "France", "Marie (a) Curie"]
    assert fact_ends("Paris is the capital of France.\n(no fact)") == []
