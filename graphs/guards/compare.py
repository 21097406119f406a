"""Comparisons settled in code. For "Which film came out first, X or Y?" a small model often finds both
dates and then names the wrong film, or a date: when the sub-answers hold one date of the same kind per
option, the earlier or later option is picked here instead (`compare_dates`). And when the answer to a
"which/who ..., X or Y?" question names neither option but is what a step about one of them found (the
director of X, for "Which film has the younger director, X or Y?"), that option is the answer (`as_option`)."""
from __future__ import annotations

import re
from typing import NamedTuple

MONTHS = {name: i for i, names in enumerate(
    [("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",), ("june", "jun"),
     ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"), ("october", "oct"), ("november", "nov"),
     ("december", "dec")], start=1) for name in names}
NOTE = "DateComparison"  # how an agent's note on a comparison settled here starts
OPTION_NOTE = "OptionAnswer"  # how an agent's note on an answer mapped to an option starts
EARLIER = ("earlier", "earliest", "first", "older", "oldest", "sooner")
LATER = ("later", "latest", "last", "younger", "youngest", "more recent", "most recent", "more recently")
KINDS = {  # what a date is of, by the words that ask for it
    "birth": ("born", "birth", "birthday"),
    "death": ("died", "die", "dies", "death", "dead"),
    "release": ("released", "release", "came out", "come out", "published", "premiered", "aired"),
    "start": ("founded", "formed", "established", "opened", "built", "started", "began", "created"),
}
ASKS_DATE = ("when", "year", "date", *(w for words in KINDS.values() for w in words))
NOT_A_DATE_ORDER = re.compile(r"\b(age|aged|lived|longer|shorter|died (younger|older))\b", re.IGNORECASE)
_WORDS = r"\b(?P<word>" + "|".join(EARLIER + LATER) + r")\b"
_ASKS_OPTION = r"(?i)^(?:which|who)\b"  # "When was ..., X or Y?" asks for a date, not an option
_END = r"[\s?.]*$"
_OPTIONS = [re.compile(_ASKS_OPTION + r"[^,:]*[,:]\s*(?P<a>.+?),?\s+or\s+(?P<b>.+?)" + _END),
            re.compile(_ASKS_OPTION + r".*?\bout of\s+(?P<a>.+?)\s+and\s+(?P<b>.+?)" + _END)]
_MONTH = r"(?P<month>" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_DATES = [re.compile(p, re.IGNORECASE) for p in (
    r"\b(?P<year>\d{4})-(?P<m>\d{1,2})-(?P<day>\d{1,2})\b",
    r"\b(?P<day>\d{1,2})(?:st|nd|rd|th)?\s+" + _MONTH + r",?\s+(?P<year>\d{3,4})\b",
    r"\b" + _MONTH + r"\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?,?\s+(?P<year>\d{3,4})\b",
    r"\b" + _MONTH + r",?\s+(?P<year>\d{3,4})\b",
    r"\b(?P<year>\d{3,4})\b")]
_WORD = re.compile(r"[a-z]+|\d+")
_QUOTES = " \"'“”‘’,.;"


class Step(NamedTuple):
    text: str  # the sub-goal as it ran
    answer: str  # "" when it has no confirmed answer
    depends_on: list[int]  # positions (1-based) in the list of steps of the steps it used


def comparison(question: str) -> tuple[str, str, bool] | None:
    """(first option, second option, whether the earlier date wins) of a date comparison: a question naming
    two options (`options`) with an earlier/later word before them and before any comma; None otherwise."""
    text = " ".join(question.split())
    if NOT_A_DATE_ORDER.search(text) or (m := _match_options(text)) is None:
        return None
    word = re.search(_WORDS, re.split(r"[,:]", text[:m.start("a")], maxsplit=1)[0], re.IGNORECASE)
    return (m["a"].strip(_QUOTES), m["b"].strip(_QUOTES), word["word"].lower() in EARLIER) if word else None


def options(question: str) -> tuple[str, str] | None:
    """The two options a "which/who ..., X or Y?" (or "... out of X and Y?") question names; None otherwise."""
    m = _match_options(" ".join(question.split()))
    return (m["a"].strip(_QUOTES), m["b"].strip(_QUOTES)) if m else None


_AUX = re.compile(r"(?i)^(?:is|are|was|were|do|does|did|can|could|has|have|had|will|would|should)\b")


def asks_yes_or_no(question: str) -> bool:
    """Whether the question is answered yes or no: it opens with an auxiliary ("Are both ...", "Did X ...")
    and names no alternatives ("Is X a man or a woman?" is not)."""
    text = " ".join(question.split())
    return bool(_AUX.match(text)) and not re.search(r"(?i)\bor\b", text)


def _match_options(text: str) -> re.Match | None:
    return next((m for pattern in _OPTIONS if (m := pattern.match(text))), None)


def parse_date(text: str) -> tuple[int, int, int] | None:
    """(year, month, day) of a date answer, 0 for a part it does not give; None unless it holds one date."""
    if re.search(r"\b(bc|bce)\b", text, re.IGNORECASE):
        return None
    found, rest = set(), text
    for pattern in _DATES:
        for m in pattern.finditer(rest):
            month = MONTHS[m["month"].lower()] if "month" in m.groupdict() else int(m.groupdict().get("m") or 0)
            found.add((int(m["year"]), month, int(m.groupdict().get("day") or 0)))
        rest = pattern.sub(" ", rest)
    return found.pop() if len(found) == 1 else None


def _words(text: str) -> str:
    """The lowercased words of `text`, space-separated and padded, so that `f" {phrase} " in` matches whole words."""
    return f" {' '.join(_WORD.findall(text.lower()))} "


def kind(text: str) -> str | None:
    """What the date a text asks for is of ("birth", "death", ...), when its words say."""
    words = _words(text)
    return next((k for k, names in KINDS.items() if any(f" {n} " in words for n in names)), None)


def _asks_date(text: str) -> bool:
    words = _words(text)
    return any(f" {w} " in words for w in ASKS_DATE)


def _before(x: tuple[int, int, int], y: tuple[int, int, int]) -> bool | None:
    """Whether date `x` is before `y`; None when their given parts do not decide it."""
    for a, b in zip(x, y):
        if not a or not b:
            return None
        if a != b:
            return a < b
    return None


def _mentions(text: str, option: str) -> bool:
    return _words(option) in _words(text)


def _option_of(steps: list[Step], i: int, options: tuple[str, str], seen: frozenset[int] = frozenset()) -> int | None:
    """The option (0 or 1) step `i` (0-based) is about: the one its text names, else the one of the steps it used."""
    named = [k for k, option in enumerate(options) if _mentions(steps[i].text, option)]
    if len(named) == 1:
        return named[0]
    if named:
        return None
    found = {_option_of(steps, d - 1, options, seen | {i}) for d in steps[i].depends_on
             if 0 < d <= len(steps) and d - 1 not in seen}
    return found.pop() if len(found) == 1 else None


def compare_dates(question: str, steps: list[Step]) -> tuple[str, str] | None:
    """(the option that wins, why) when `question` compares two options by date and the steps that ask for a
    date hold exactly one for each option, all of one kind (birth, death, ...) where the words say; None when
    they do not, or the dates do not decide it."""
    parsed = comparison(question)
    if parsed is None:
        return None
    a, b, earlier_wins = parsed
    dates: list[set[tuple[int, int, int]]] = [set(), set()]
    kinds = {kind(question)} - {None}
    for i, step in enumerate(steps):
        date = parse_date(step.answer) if _asks_date(step.text) else None
        option = _option_of(steps, i, (a, b)) if date else None
        if date and option is not None:
            dates[option].add(date)
            kinds |= {kind(step.text)} - {None}
    if len(dates[0]) != 1 or len(dates[1]) != 1 or len(kinds) > 1:
        return None
    (da,), (db,) = dates
    a_first = _before(da, db)
    if a_first is None:
        return None
    winner = a if a_first == earlier_wins else b
    return winner, f"{a}: {'-'.join(map(str, da))}; {b}: {'-'.join(map(str, db))}"


def as_option(question: str, answer: str, steps: list[Step]) -> tuple[str, str] | None:
    """(the option, why) when `question` names two options, `answer` names neither, and the steps that found
    `answer` are all about one option; None otherwise."""
    named = options(question)
    if named is None or not _WORD.search(answer.lower()) or any(
            _mentions(answer, option) or _mentions(option, answer) for option in named):
        return None
    found = {i: _option_of(steps, i, named) for i, step in enumerate(steps) if _words(step.answer) == _words(answer)}
    if not found or len(set(found.values())) != 1 or None in found.values():
        return None
    option = named[next(iter(found.values()))]
    return option, f"{answer!r} answers step {', '.join(str(i + 1) for i in found)}, about {option!r}"
