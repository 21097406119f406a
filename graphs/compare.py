"""Date comparisons settled in code. For "Which film came out first, X or Y?" a small model often finds both
dates and then names the wrong film, or a date: when the sub-answers hold one date per option, the older or
newer option is picked here instead."""
from __future__ import annotations

import re
from typing import NamedTuple

MONTHS = {name: i for i, names in enumerate(
    [("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",), ("june", "jun"),
     ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"), ("october", "oct"), ("november", "nov"),
     ("december", "dec")], start=1) for name in names}
EARLIER = ("earlier", "earliest", "first", "older", "oldest", "sooner")
LATER = ("later", "latest", "last", "younger", "youngest", "more recent", "most recent", "more recently")
_WORDS = r"\b(?P<word>" + "|".join(EARLIER + LATER) + r")\b"
_ASKS_OPTION = r"(?i)^(?:which|who)\b[^,:]*?"  # "When was ..., X or Y?" asks for a date, not an option
_END = r"\s*\?*\s*$"
_COMPARISONS = [re.compile(_ASKS_OPTION + _WORDS + r"[^,:]*[,:]\s*(?P<a>.+?)\s+or\s+(?P<b>.+?)" + _END),
                re.compile(_ASKS_OPTION + _WORDS + r".*?\bout of\s+(?P<a>.+?)\s+and\s+(?P<b>.+?)" + _END)]
_ISO = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
_WORD = re.compile(r"[a-z]+|\d+")


class Step(NamedTuple):
    text: str  # the sub-goal as it ran
    answer: str
    depends_on: list[int]  # 1-based numbers of the steps it used


def comparison(question: str) -> tuple[str, str, bool] | None:
    """(first option, second option, whether the earlier date wins) of a date comparison; None otherwise."""
    text = " ".join(question.split())
    m = next((m for pattern in _COMPARISONS if (m := pattern.match(text))), None)
    if m is None:
        return None
    return m["a"].strip(' "'), m["b"].strip(' "'), m["word"].lower() in EARLIER


def parse_date(text: str) -> tuple[int, int, int] | None:
    """(year, month, day) of a date answer, 0 for a part it does not give; None when it holds no single year."""
    if re.search(r"\b(bc|bce)\b", text, re.IGNORECASE):
        return None
    if iso := _ISO.search(text):
        return int(iso[1]), int(iso[2]), int(iso[3])
    words = _WORD.findall(text.lower())
    years = [int(w) for w in words if w.isdigit() and 3 <= len(w) <= 4]
    if len(years) != 1:
        return None
    month = next((MONTHS[w] for w in words if w in MONTHS), 0)
    days = [int(w) for w in words if w.isdigit() and len(w) <= 2 and 1 <= int(w) <= 31]
    return years[0], month, days[0] if month and len(days) == 1 else 0


def _before(x: tuple[int, int, int], y: tuple[int, int, int]) -> bool | None:
    """Whether date `x` is before `y`; None when their given parts do not decide it."""
    for a, b in zip(x, y):
        if not a or not b:
            return None
        if a != b:
            return a < b
    return None


def _mentions(text: str, option: str) -> bool:
    return f" {' '.join(_WORD.findall(option.lower()))} " in f" {' '.join(_WORD.findall(text.lower()))} "


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
    """(the option that wins, why) when `question` compares two options by date and `steps` hold exactly
    one date for each; None when they do not, or the dates do not decide it."""
    parsed = comparison(question)
    if parsed is None:
        return None
    a, b, earlier_wins = parsed
    dates: list[set[tuple[int, int, int]]] = [set(), set()]
    for i, step in enumerate(steps):
        date = parse_date(step.answer) if step.answer else None
        option = _option_of(steps, i, (a, b)) if date else None
        if date and option is not None:
            dates[option].add(date)
    if len(dates[0]) != 1 or len(dates[1]) != 1:
        return None
    (da,), (db,) = dates
    a_first = _before(da, db)
    if a_first is None:
        return None
    winner = a if a_first == earlier_wins else b
    return winner, f"{a}: {'-'.join(map(str, da))}; {b}: {'-'.join(map(str, db))}"
