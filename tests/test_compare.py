"""Date comparisons settled in code (graphs/compare.py)."""
import pytest
from mhqa_graph.graphs.compare import Step, compare_dates, comparison, parse_date


@pytest.mark.parametrize("question, parsed", [
    ("Which film came out earlier, It'S Our Life! or Maximum Ride (Film)?",
     ("It'S Our Life!", "Maximum Ride (Film)", True)),
    ("Who is younger, Otto Lowenstein or Jurgen Çelhaka?", ("Otto Lowenstein", "Jurgen Çelhaka", False)),
    ('Which came to market first, "Hey Pa!" or "Odessa"?', ("Hey Pa!", "Odessa", True)),
    ("Which film has the director who died later, Bobby Deerfield or Yudhakaandam?",
     ("Bobby Deerfield", "Yudhakaandam", False)),
    ("Who was born first out of Attila Marosi and Michael Nardone?", ("Attila Marosi", "Michael Nardone", True)),
    ("Which film was released more recently, Siren Of Bagdad or The Storyteller Of Venice?",
     ("Siren Of Bagdad", "The Storyteller Of Venice", False)),
    ("Which university is older: University of California, Berkeley or Syracuse University?",
     ("University of California, Berkeley", "Syracuse University", True)),
    ("What is the year of the event which occurred first, A was founded, or B opened?", None),
    ("Are Barrington, Illinois and Kushk-E Sofla, Kerman located in the same country?", None),
    ("Where was the director of Inception born?", None),
    ("Who was the first president, George Washington?", None),
])
def test_comparison(question, parsed):
    assert comparison(question) == parsed


@pytest.mark.parametrize("text, date", [
    ("April 6, 1975", (1975, 4, 6)), ("27 January 1913", (1913, 1, 27)), ("2005", (2005, 0, 0)),
    ("1975-04-06", (1975, 4, 6)), ("Sept 1887", (1887, 9, 0)), ("born in 870", (870, 0, 0)),
    ("Christopher Nolan", None), ("1990 or 1991", None), ("44 BC", None), ("", None),
])
def test_parse_date(text, date):
    assert parse_date(text) == date


BRIDGE = "Which film has the director born earlier, Wish I Was Here or The Jack-Knife Man?"


def test_bridge_comparison_follows_the_placeholders_to_the_option():
    steps = [Step("Who directed Wish I Was Here?", "Zach Braff", []),
             Step("Who directed The Jack-Knife Man?", "Jack Lee", []),
             Step("When was Zach Braff born?", "April 6, 1975", [1]),
             Step("When was Jack Lee born?", "27 January 1913", [2]),
             Step("Which of the two directors was born earlier?", "Hans Müller", [3, 4])]
    winner, why = compare_dates(BRIDGE, steps)
    assert winner == "The Jack-Knife Man" and why == "Wish I Was Here: 1975-4-6; The Jack-Knife Man: 1913-1-27"
    later = BRIDGE.replace("earlier", "later")
    assert compare_dates(later, steps)[0] == "Wish I Was Here"


@pytest.mark.parametrize("steps", [
    [Step("When was Wish I Was Here released?", "2014", [])],  # one option has no date
    [Step("When was Wish I Was Here released?", "2014", []), Step("When was The Jack-Knife Man released?", "2014", [])],
    [Step("When was Wish I Was Here released?", "2014", []), Step("When was The Jack-Knife Man released?", "", [])],
    [Step("When was Wish I Was Here released?", "2014", []), Step("Who directed Wish I Was Here?", "1975", []),
     Step("When was The Jack-Knife Man released?", "1920", [])],  # two dates for one option
    [Step("When were Wish I Was Here and The Jack-Knife Man released?", "2014", []),
     Step("When was The Jack-Knife Man released?", "1920", [])],  # a step naming both options is not used
])
def test_undecided_comparisons_are_left_to_the_model(steps):
    assert compare_dates(BRIDGE, steps) is None
