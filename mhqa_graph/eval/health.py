"""Protocol health: whether an agent did what its design says, read from the trace of an eval record.

Per question:
- `acted`: the design's own action happened, as its spec decides (`DesignSpec.acted`). Omne ran at least one tool
  call that returned a result (not an error, not a repeat); Mujica dispatched at least one worker; OPERA retrieved
  for at least one sub-goal; rag retrieved. None for `direct` and `auto`, which have no action of their own.
- `invented`: tool results the model wrote itself (`<tool_response>` in its own replies).
- `malformed`: the run ended with a MalformedOutput error.
- `repairs`: model calls that answered a repair, nudge or send-back message (a reply could not be used).
- `forced`: model calls that had to answer because a cap was reached; `forced_by`: why, the kinds of the typed
  notes (`mhqa_graph.notes`) or error that forced them (`RoundCap`, `NoProgress`), sorted; [] when nothing was
  forced.
- `bad_answer`: the answer is empty or longer than 10 words.
- `guards`: firings per guard (graphs/guards/), enforced or logged; `guard_changed`: an enforced firing
  changed the run (a prompt hint such as `options_line` does not count); `answer_guard`: an enforced guard
  replaced the model's final answer.
- `constrained`: model calls whose reply the backend constrained to its format (a grammar or a JSON schema).
- `cache_errors`: model calls whose cached prompt state the backend refused, so the prompt was prefilled in full.

Over a run, `behaviour` gives the rates that training moves first: well-formed runs, answer length, answers that say
there is none, and each design's own (`DesignSpec.rates`: tool calls for Omne, worker dispatch for Mujica).
"""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median
from typing import Any

from ..designs import spec_of
from ..messages import FORCES, RETRIES, SEND_BACK, last_kind
from ..notes import NO_PROGRESS, ROUND_CAP, note_kind
from ..traces import Trace

MAX_ANSWER_WORDS = 10
INVENTED = "<tool_response>"
FORCE_REASONS = (ROUND_CAP, NO_PROGRESS)  # the kinds of the notes (Mujica) and errors (Omne) that force an answer


def acted(trace: Trace) -> bool | None:
    """Whether the agent's own action happened, as its design's spec decides; None for an agent without one."""
    spec = spec_of(trace.agent)
    return spec.acted(trace) if spec else None


def forced_by(trace: Trace) -> list[str]:
    """The kinds of the typed notes and error of a run's final state that force an answer (FORCE_REASONS)."""
    notes = [*(trace.design.get("notes") or []), trace.design.get("error") or ""]
    return sorted({kind for n in notes if isinstance(n, str) and (kind := note_kind(n)) in FORCE_REASONS})


def health(record: dict, trace: Trace) -> dict[str, Any]:
    """The protocol health of one eval record (see the module docstring)."""
    answer = (record.get("prediction") or "").split()
    forced = sum(last_kind(c, trace.kinds) in FORCES for c in trace.llm_calls)
    return {
        "acted": acted(trace),
        "invented": sum(c.output.count(INVENTED) for c in trace.llm_calls),
        "malformed": "MalformedOutput" in (record.get("error") or ""),
        "repairs": sum(last_kind(c, trace.kinds) in RETRIES for c in trace.llm_calls),
        "forced": forced,
        "forced_by": forced_by(trace) if forced else [],
        "bad_answer": not answer or len(answer) > MAX_ANSWER_WORDS,
        **guard_health(trace.design.get("guards")),
        "constrained": sum(c.decoding != "prompt" for c in trace.llm_calls),
        "cache_errors": sum(bool(c.cache_error) for c in trace.llm_calls),
    }


def guard_health(firings: Any) -> dict[str, Any]:
    """Firings per guard, whether an enforced one changed the run, and whether one replaced the answer (each
    firing says whether its guard is prompt-only and whether it replaces answers; firings recorded before it
    said so are looked up in the guard registry)."""
    firings = [_described(f) for f in firings or [] if isinstance(f, dict) and isinstance(f.get("guard"), str)]
    firings = [f for f in firings if f is not None]
    counts: dict[str, int] = {}
    for f in firings:
        counts[f["guard"]] = counts.get(f["guard"], 0) + 1
    enforced = [f for f in firings if f.get("enforced") and not f["prompt_only"]]
    return {"guards": counts, "guard_changed": bool(enforced),
            "answer_guard": any(f["replaces_answer"] for f in enforced)}


def _described(firing: dict) -> dict | None:
    """A firing with `prompt_only` and `replaces_answer`; None for a guard no longer known."""
    if "prompt_only" in firing and "replaces_answer" in firing:
        return firing
    from ..graphs.guards import GUARDS  # an older firing: the registry says what its guard does

    guard = GUARDS.get(firing["guard"])
    return None if guard is None else firing | {"prompt_only": guard.prompt_only,
                                                "replaces_answer": guard.replaces_answer}


class HealthTotals:
    """`health_summary` kept up one record's `health` at a time (a report holds no record)."""

    COUNTS = ("invented", "repairs", "forced", "constrained", "cache_errors")  # summed
    FLAGS = {"malformed": "malformed", "bad_answer": "bad_answers", "guard_changed": "guard_changed",
             "answer_guard": "answer_guard"}  # questions where true

    def __init__(self) -> None:
        self.totals: dict[str, Any] = dict.fromkeys(("questions", "acted", "acted_of", *self.COUNTS,
                                                     *self.FLAGS.values()), 0)
        self.guards: dict[str, int] = {}

    def add(self, row: Any) -> None:
        if not isinstance(row, dict):
            return
        t = self.totals
        t["questions"] += 1
        if row.get("acted") is not None:
            t["acted"], t["acted_of"] = t["acted"] + bool(row["acted"]), t["acted_of"] + 1
        for key in self.COUNTS:
            t[key] += row.get(key, 0)
        for key, name in self.FLAGS.items():
            t[name] += bool(row.get(key))
        for name in row.get("guards") or {}:  # per guard, the questions it fired in
            self.guards[name] = self.guards.get(name, 0) + 1

    def result(self) -> dict[str, Any]:
        t = self.totals
        return {"questions": t["questions"], "acted": t["acted"], "acted_of": t["acted_of"],
                "invented": t["invented"], "malformed": t["malformed"], "repairs": t["repairs"],
                "forced": t["forced"], "bad_answers": t["bad_answers"], "guard_changed": t["guard_changed"],
                "answer_guard": t["answer_guard"], "guards": dict(sorted(self.guards.items())),
                "constrained": t["constrained"], "cache_errors": t["cache_errors"]}


def health_summary(rows: Iterable[dict]) -> dict[str, Any]:
    """Totals over the `health` fields of records: questions where the agent acted (and of how many it
    could), invented results, malformed runs, repairs, forced answers, bad answers, constrained calls and
    cache errors."""
    totals = HealthTotals()
    for row in rows:
        totals.add(row)
    return totals.result()


def format_repairs(record: dict) -> int:
    """Model calls of an eval record that answered a format repair or a nudge (not a send-back guard); a compact
    record without its trace says it (`format_repairs`)."""
    if "trace" not in record and "format_repairs" in record:
        return int(record["format_repairs"])
    trace = record.get("trace") or {}
    kinds = [last_kind(c, bool(trace.get("kinds"))) for c in trace.get("llm_calls") or []]
    return sum(k in RETRIES and k != SEND_BACK for k in kinds)


def behaviour(records: list[dict]) -> dict[str, Any]:
    """The behaviour rates of a run's eval records (rates are shares of its questions):
    - `well_formed`: no malformed end (health's `malformed`) and no model call answering a format repair or a
      nudge (`format_repairs`; a guard's send-back is not a format fault), with the counts `malformed` (runs)
      and `repairs` (calls);
    - each design's own rates (`DesignSpec.rates`), for the agents of the run: Omne's `tool_rate` (at least one
      tool call), `acted_rate` (at least one successful call: a result, not an error or a repeat) and
      `successful_calls` in all; Mujica's `worker_rate` (at least one worker consulted) and `dispatches` (worker
      calls, repairs not counted);
    - `answer_chars` (median characters of the answers), `unknown` (answers that say there is none:
      empty, "unknown", "not stated", ...) and `guarded` (questions on which a guard fired)."""
    from ..graphs.answers import is_no_answer  # here, not at load time: the core never loads graphs/ (test_layout)

    n = max(1, len(records))
    malformed = [bool((r.get("health") or {}).get("malformed")) for r in records]
    repairs = [format_repairs(r) for r in records]
    traces = [r.get("trace") or {} for r in records]
    out: dict[str, Any] = {
        "well_formed": sum(not m and not k for m, k in zip(malformed, repairs)) / n,
        "malformed": sum(malformed), "repairs": sum(repairs),
        "answer_chars": median([len((r.get("prediction") or "").strip()) for r in records] or [0]),
        "unknown": sum(is_no_answer(r.get("prediction") or "") for r in records),
        "guarded": sum(bool((r.get("health") or {}).get("guards")) for r in records),
    }
    for agent in dict.fromkeys(t.get("agent") for t in traces):
        if spec := spec_of(str(agent)):
            out |= spec.rates(traces)
    return out
