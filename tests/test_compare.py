"""Date comparisons settled in code (graphs/answers.py)."""
import pytest
from mhqa_graph.graphs.answers import (
    Step,
    as_option,
    asks_yes_or_no,
    compare_dates,
    comparison,
    kind,
    options,
    parse_date,
)


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
    ("Who died first, Ann Flood, or Louis Leroux.", ("Ann Flood", "Louis Leroux", True)),
    ("What is the year of the event which occurred first, A was founded, or B opened?", None),
    ("When was the director born, Inception or Heat?", None),
    ("Who lived longer, Ann Flood or Louis Leroux?", None),
    ("Which film has the director who died at a younger age, Heat or Alien?", None),
    ("Who died younger, Ann Flood or Louis Leroux?", None),
    ("Are Barrington, Illinois and Kushk-E Sofla, Kerman located in the same country?", None),
    ("Where was the director of Inception born?", None),
])
def test_comparison(question, parsed):
    assert comparison(question) == parsed


@pytest.mark.parametrize("text, date", [
    ("April 6, 1975", (1975, 4, 6)), ("27 January 1913", (1913, 1, 27)), ("2005", (2005, 0, 0)),
    ("1975-04-06", (1975, 4, 6)), ("Sept. 1887", (1887, 9, 0)), ("born in 870", (870, 0, 0)),
    ("died in March 1950 aged 30", (1950, 3, 0)), ("It may have been 1950", (1950, 0, 0)),
    ("the 3rd of May 1801", (1801, 5, 0)),  # "3rd of" is not read as a day
    ("Christopher Nolan", None), ("1990 or 1991", None), ("2010-01-01 to 2014-05-05", None), ("44 BC", None),
    ("", None),
])
def test_parse_date(text, date):
    assert parse_date(text) == date


@pytest.mark.parametrize("text, found", [
    ("When was Zach Braff born?", "birth"), ("What is the date of death of X?", "death"),
    ("When did It's Our Life! come out?", "release"), ("When was Syracuse University founded?", "start"),
    ("What year is it?", None),
])
def test_kind(text, found):
    assert kind(text) == found


BRIDGE = "Which film has the director born earlier, Wish I Was Here or The Jack-Knife Man?"
BRIDGE_STEPS = [Step("Who directed Wish I Was Here?", "Zach Braff", []),
                Step("Who directed The Jack-Knife Man?", "Jack Lee", []),
                Step("When was Zach Braff born?", "April 6, 1975", [1]),
                Step("When was Jack Lee born?", "27 January 1913", [2]),
                Step("Which of the two directors was born earlier?", "Hans Müller", [3, 4])]


def test_bridge_comparison_follows_the_dependencies_to_the_option():
    winner, why = compare_dates(BRIDGE, BRIDGE_STEPS)
    assert winner == "The Jack-Knife Man" and why == "Wish I Was Here: 1975-4-6; The Jack-Knife Man: 1913-1-27"
    assert compare_dates(BRIDGE.replace("earlier", "later"), BRIDGE_STEPS)[0] == "Wish I Was Here"


@pytest.mark.parametrize("question, steps", [
    (BRIDGE, BRIDGE_STEPS[:3]),  # one option has no date
    (BRIDGE, [Step("When was Wish I Was Here released?", "2014", []),
              Step("When was The Jack-Knife Man released?", "2014", [])]),  # the same year
    (BRIDGE, [Step("When was Wish I Was Here released?", "2014", []),
              Step("When was The Jack-Knife Man released?", "", [])]),  # no confirmed answer
    (BRIDGE, [Step("When was Wish I Was Here released?", "2014", []), Step("When was Wish I Was Here set?", "1975", []),
              Step("When was The Jack-Knife Man released?", "1920", [])]),  # two dates for one option
    (BRIDGE, [Step("When were Wish I Was Here and The Jack-Knife Man released?", "2014", []),
              Step("When was The Jack-Knife Man released?", "1920", [])]),  # a step naming both is not used
    (BRIDGE, BRIDGE_STEPS[:2] + [Step("When was Zach Braff born?", "April 6, 1975", [1]),
                                 Step("When did Jack Lee die?", "1999", [2])]),  # a birth against a death
    ("Which film has the director who died later, Wish I Was Here or The Jack-Knife Man?",
     BRIDGE_STEPS),  # birth dates do not answer "died later"
    ("Who was born first, The 300 Spartans or Heat?",
     [Step("Who stars in The 300 Spartans?", "300", []), Step("When was Heat born?", "1995", [])]),
])
def test_undecided_comparisons_are_left_to_the_model(question, steps):
    assert compare_dates(question, steps) is None


@pytest.mark.parametrize("question, named", [
    ("Which film whose director is younger, Bloody Moon or The House Of Pulcini?",
     ("Bloody Moon", "The House Of Pulcini")),
    ("Who died at a younger age, Ann Flood or Louis Leroux?", ("Ann Flood", "Louis Leroux")),
    ("Who was born first out of Attila Marosi and Michael Nardone?", ("Attila Marosi", "Michael Nardone")),
    ("Are Barrington, Illinois and Kushk-E Sofla, Kerman located in the same country?", None),
    ("Where was the director of Inception born?", None),
])
def test_options(question, named):
    assert options(question) == named


DIRECTORS = [Step("Who directed Bloody Moon?", "Jesús Franco", []),
             Step("Who directed The House of Pulcini?", "Mario Camerini", []),
             Step("Is Jesus Franco younger than Mario Camerini?", "yes", [1, 2])]
QUESTION = "Which film whose director is younger, Bloody Moon or The House Of Pulcini?"


def test_an_answer_found_about_one_option_becomes_that_option():
    """The real planner (2Wiki text) concluded with the director of the film it meant."""
    assert as_option(QUESTION, "Jesús Franco", DIRECTORS) == (
        "Bloody Moon", "'Jesús Franco' answers step 1, about 'Bloody Moon'")
    chained = [Step("Who directed Bloody Moon?", "Jesús Franco", []), Step("When was #q1 born?", "1930", [1])]
    assert as_option(QUESTION, "1930", chained)[0] == "Bloody Moon"  # through the step it used


@pytest.mark.parametrize("answer, steps", [
    ("Bloody Moon", DIRECTORS),  # already an option
    ("the house of pulcini", DIRECTORS),
    ("Mario Bava", DIRECTORS),  # found by no step
    ("yes", DIRECTORS),  # the step names both options' directors, not an option
    ("Franco", [Step("Who directed Bloody Moon?", "Franco", []),
                Step("Who directed The House of Pulcini?", "Franco", [])]),
    ("", DIRECTORS),
])
def test_an_answer_is_left_alone_unless_the_steps_tie_it_to_one_option(answer, steps):
    assert as_option(QUESTION, answer, steps) is None


def test_a_question_without_options_is_left_alone():
    assert as_option("Who directed Bloody Moon?", "Jesús Franco", DIRECTORS) is None


@pytest.mark.parametrize("question, yes_no", [
    ("Are both films from the same country?", True),
    ("Did Nolan direct Inception?", True),
    ("Is claudius 's husband a man or a woman ?", False),
    ("Who is the parent of anna 's son?", False),
    ("the parent of anna of holstein-gottorp 's son ?", False),
])
def test_yes_no_questions_are_told_apart(question, yes_no):
    assert asks_yes_or_no(question) is yes_no
