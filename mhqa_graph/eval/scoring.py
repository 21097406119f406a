"""Answer scoring exactly as the HotpotQA / SQuAD evaluation scripts do it.

`normalize_answer` (mhqa_graph/text.py) is the official normalisation (lower-case, drop ASCII punctuation,
drop the articles a/an/the, collapse white space). `f1_score` is HotpotQA's token F1, which scores a
yes/no/noanswer mismatch as 0. `score` takes the max over all gold aliases (MuSiQue
`answer_aliases`, PathQuestion alternates), each metric separately, as MuSiQue's script does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ..text import normalize_answer

_SPECIAL = ("yes", "no", "noanswer")


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 of the normalised strings; 0 if either side is yes/no/noanswer and they differ."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def score(prediction: str | None, golds: Iterable[str]) -> tuple[float, float]:
    """(EM, F1) of `prediction`, each the max over the gold aliases; (0, 0) without golds."""
    golds = list(golds)
    prediction = prediction or ""
    if not golds:
        return 0.0, 0.0
    return max(exact_match(prediction, g) for g in golds), max(f1_score(prediction, g) for g in golds)
