"""Answers that are not answers: refusals, "not found" and placeholders that small models write in an
answer field, short answers that no retrieved passage contains, and sentences where a short answer was asked."""

from __future__ import annotations

import re

from mhqa_graph.eval.scoring import normalize_answer

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
