"""What an answer says, as pure functions of its text, for the designs, `auto` and eval health alike.

Answers that are not answers: refusals, "not found" and placeholders that small models write in an answer field
(`is_no_answer`), short answers that no retrieved passage contains (`grounded`), and sentences where a short
answer was asked (`is_sentence`).

Comparisons settled in code. For "Which film came out first, X or Y?" a small model often finds both dates and
then names the wrong film, or a date: when the sub-answers hold one date of the same kind per option, the earlier
or later option is picked (`compare_dates`). And when the answer to a "which/who ..., X or Y?" question names
neither option but is what a step about one of them found (the director of X, for "Which film has the younger
director, X or Y?"), that option is the answer (`as_option`)."""

from __future__ import annotations

import re
from typing import NamedTuple

from mhqa_graph.text import normalize_answer

# -- comparisons settled in code ---------------------------------------------------------------
MONTHS = {name: i for i, names in enumerate(
    [("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",), ("june", "jun"),
     ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"), ("october", "oct"), ("november", "nov"),
     ("december", "dec")], start=1) for name in names}
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


# -- answers that are not answers ------------------------------------------------------------
# the whole answer, normalised (lower-case, no punctuation or articles)
_BARE = {
    "", "unknown", "none", "null", "nil", "na", "n a", "no answer", "not found", "not available", "not mentioned",
    "not stated", "not specified", "not given", "not provided", "not known", "not clear", "unclear", "insufficient",
    "insufficient information", "insufficient data", "insufficient context", "no information", "no data",
    "cannot be determined", "can not be determined", "cannot determine", "undetermined", "unanswerable",
    "i dont know", "i do not know", "dont know", "not sure", "unsure", "no idea", "no relevant information",
    "none found", "tbd", "short answer", "your answer", "answer", "information not available", "not applicable",
}
MIN_SENTENCE_WORDS = 3  # below this, only the whole-answer list applies (titles such as "Never Say Never")
_SENTENCE = re.compile("|".join([
    r"\b(?:do|does|did|is|are|was|were|has|have|had|can|could)\s*(?:not|n't)\s+(?:\w+\s+){0,2}?"
    r"(?:mention|state|specif|say|provide|contain|include|give|indicat|list|tell|appear|know|show|answer|identif"
    r"|determin|find|reveal|refer|discuss)\w*",
    r"\bnot\s+(?:\w+\s+)?(?:mentioned|stated|specified|provided|given|found|available|listed|known|included"
    r"|indicated|determinable|identified|present|contained)\b",
    r"\bno\s+(?:\w+\s+){0,2}?(?:information|mention|data|evidence|answer|record|details?|indication)\b",
    r"\b(?:cannot|can't|can not|unable to|could not|couldn't|impossible to)\s+(?:be\s+)?(?:\w+\s+)?"
    r"(?:determin|find|found|answer|identif|tell|say|infer|know|establish|confirm)\w*",
    r"\b(?:insufficient|not enough|lacks?|missing)\b.{0,20}\b(?:information|context|data|evidence|details?)\b",
    r"\b(?:is|are|was|remains?)\s+(?:\w+\s+)?(?:unknown|unclear|unspecified)\b",
    r"\bnone of the (?:passages|contexts|documents|facts|texts|sources)\b",
    r"\bi (?:don't|do not) know\b",
]), re.IGNORECASE)


def is_no_answer(text: str) -> bool:
    """Whether `text`, given as an answer, says there is none: empty, "unknown", "Not found",
    "The passages do not mention X", "cannot be determined", ..."""
    norm = normalize_answer(text)
    if norm in _BARE or not norm.strip("? ."):
        return True
    return len(norm.split()) >= MIN_SENTENCE_WORDS and bool(_SENTENCE.search(text))


MAX_GROUNDED_WORDS = 6  # longer answers are phrases the model composed: not checked
_FREE = {"yes", "no"}  # answers no passage needs to contain


def grounded(answer: str, passages: list[str]) -> bool:
    """Whether a short answer appears in at least one passage: every word of it (normalised) in the same
    passage. Yes/no and answers longer than MAX_GROUNDED_WORDS always count as grounded."""
    words = normalize_answer(answer).split()
    if not words or len(words) > MAX_GROUNDED_WORDS or " ".join(words) in _FREE:
        return True
    return any(set(words) <= set(normalize_answer(p).split()) for p in passages)


LONG_WORDS = 12  # an answer this long is a sentence, whatever its words
_VERB = re.compile(r"\b(?:is|are|was|were|has|have|had|does|did)\b", re.IGNORECASE)
MIN_VERB_WORDS = 6  # an answer this long with one of _VERB is a sentence ("X's son is the parent of Y.")


def is_sentence(answer: str) -> bool:
    """Whether an answer reads as a sentence rather than a short answer: LONG_WORDS words or more, or
    MIN_VERB_WORDS or more with a finite verb such as "is" or "was" (titles such as "Life Is a Long Quiet
    River" are caught too: check them against the answers found before asking again)."""
    words = answer.split()
    return len(words) >= LONG_WORDS or (len(words) >= MIN_VERB_WORDS and bool(_VERB.search(answer)))
