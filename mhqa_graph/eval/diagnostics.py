"""Where a multi-hop run broke: which hops of the gold chain the agent's trace saw evidence for, the
first hop it never saw, and why a wrong answer is wrong.

A hop's evidence counts as seen when a step of the trace retrieved one of its passages (by id), or
when anything shown to the model (a prompt, a tool result) has one line naming both ends of one of
its triples, the way facts are rendered (`(subject) -[relation]-> (object)`).

Failure classes of a question that is not an exact match:
- `format`: F1 > 0, the answer is partly right but not in the gold form;
- `retrieval`: F1 = 0 and some hop's evidence was never seen;
- `reasoning`: F1 = 0 although the evidence of every hop was seen;
- `error`: the run raised;
- `unknown`: F1 = 0 and the dataset has no gold evidence for the question.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

from ..ingest.datasets import Hop
from ..parsing import words
from ..traces import Trace

FAILURE_CLASSES = ("retrieval", "reasoning", "format", "error", "unknown")


def shown_lines(trace: Trace) -> list[str]:
    """Every line the model was shown (all non-assistant messages of every call) or a tool returned,
    normalised to lower-case words."""
    texts = [m.content for call in trace.llm_calls for m in call.messages if m.role != "assistant"]
    texts += [c.output for c in trace.tool_calls]
    return [words(line) for text in texts for line in text.splitlines() if line.strip()]


def retrieved_ids(trace: Trace) -> set[str]:
    return {r.id for step in trace.steps for r in step.retrieved}


def hop_seen(hop: Hop, ids: set[str], lines: Sequence[str]) -> bool | None:
    """Whether the trace saw the hop's evidence; None when the hop has none."""
    if not hop.passage_ids and not hop.triples:
        return None
    if ids.intersection(hop.passage_ids):
        return True
    for s, _, o in hop.triples:
        s, o = f" {words(s)} ", f" {words(o)} "
        if any(s in f" {line} " and o in f" {line} " for line in lines):
            return True
    return False


def chain_json(chain: Iterable[Hop]) -> list[dict[str, Any]]:
    return [asdict(h) for h in chain]


def chain_from_json(rows: Iterable[dict]) -> list[Hop]:
    return [Hop(question=r.get("question"), answer=r.get("answer"), passage_ids=tuple(r.get("passage_ids") or ()),
                triples=tuple(tuple(t) for t in r.get("triples") or ())) for r in rows]


def diagnose(chain: Sequence[Hop], trace: Trace, em: float, f1: float, failed: bool = False) -> dict[str, Any]:
    """{"hops_seen": [bool | None per hop], "evidence_recall": seen / hops with evidence (None if none),
    "first_missed_hop": 1-based or None, "failure": a FAILURE_CLASSES value or None when EM = 1}."""
    ids, lines = retrieved_ids(trace), shown_lines(trace)
    seen = [hop_seen(h, ids, lines) for h in chain]
    known = [s for s in seen if s is not None]
    missed = next((i for i, s in enumerate(seen, start=1) if s is False), None)
    if failed:
        failure = "error"
    elif em >= 1.0:
        failure = None
    elif f1 > 0:
        failure = "format"
    elif not known:
        failure = "unknown"
    else:
        failure = "retrieval" if missed is not None else "reasoning"
    return {"hops_seen": seen, "evidence_recall": sum(known) / len(known) if known else None,
            "first_missed_hop": missed, "failure": failure}


class FailureTotals:
    """`failure_summary` kept up one record at a time (a report holds no record)."""

    def __init__(self) -> None:
        self.questions, self.recall_sum, self.recalls = 0, 0.0, 0
        self.failures: Counter = Counter()
        self.missed: Counter = Counter()

    def add(self, record: dict) -> None:
        d = record.get("diagnostics")
        if not isinstance(d, dict):
            return
        self.questions += 1
        self.failures[d.get("failure")] += 1
        if d.get("evidence_recall") is not None:
            self.recall_sum, self.recalls = self.recall_sum + d["evidence_recall"], self.recalls + 1
        if d.get("first_missed_hop"):
            self.missed[d["first_missed_hop"]] += 1

    def result(self) -> dict[str, Any]:
        return {"questions": self.questions, "failures": {k: self.failures[k] for k in FAILURE_CLASSES},
                "evidence_recall": self.recall_sum / self.recalls if self.recalls else None,
                "first_missed_hop": {str(k): v for k, v in sorted(self.missed.items())}}


def failure_summary(records: Iterable[dict]) -> dict[str, Any]:
    """Counts of failure classes, mean evidence recall and the first missed hops over records that
    carry `diagnostics`."""
    totals = FailureTotals()
    for r in records:
        totals.add(r)
    return totals.result()
