"""Summaries of evaluation runs: metrics of a results file, one run's table, and a side-by-side
comparison of several runs over the questions they share, with a bar plot; records carried from a run
with guards on into one with them off."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from ..redaction import redact
from .diagnostics import FAILURE_CLASSES, FailureTotals
from .health import HealthTotals
from .paired import cluster_key, paired_comparison

RESULTS, SUMMARY = "results.jsonl", "summary.json"


# what a summary reads of a record: everything but its trace (the bulk of it)
SUMMARY_FIELDS = ("id", "em", "f1", "failed", "error", "latency", "tokens", "llm_calls", "llm_calls_cached", "type",
                  "hops", "diagnostics", "health", "route", "chain", "cluster", "prediction", "carried")


def iter_records(path: str | Path, keep: Iterable[str] | None = None) -> Iterator[dict]:
    """The complete records of a results file, first one per id, one at a time; with `keep`, only those fields
    of each. A line that does not parse (a torn last line of a killed process) is ignored."""
    kept = None if keep is None else set(keep)
    seen: set[str] = set()
    path = Path(path)
    if not path.exists():
        return
    with path.open("rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict) and "id" in record and str(record["id"]) not in seen:
                seen.add(str(record["id"]))
                yield record if kept is None else {k: v for k, v in record.items() if k in kept}


def read_records(path: str | Path, keep: Iterable[str] | None = None) -> list[dict]:
    """`iter_records` as a list."""
    return list(iter_records(path, keep))


def carry_over(source: str | Path, target: str | Path, ids: Iterable[str], off: Iterable[str] | None,
               tag: str) -> int:
    """Append to the run folder `target` the records of the run folder `source` for the `ids` that `target` has
    not answered and on which none of the guards `off` fired (None: no guard at all), each marked
    `carried: tag`; returns how many. A run that differs from `source` only in those guards being off answers
    such a question alike, given the same model, settings and greedy decoding, so it need not ask it again."""
    wanted = set(ids) - {r["id"] for r in read_records(Path(target) / RESULTS)}
    blocking = None if off is None else set(off)

    def alike(record: dict) -> bool:
        fired = set((record.get("health") or {}).get("guards") or {})
        return not (fired if blocking is None else fired & blocking)

    rows = [r for r in read_records(Path(source) / RESULTS) if r["id"] in wanted and not r.get("error") and alike(r)]
    if rows:
        Path(target).mkdir(parents=True, exist_ok=True)
        with (Path(target) / RESULTS).open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r | {"carried": tag}, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class Group:
    n: int = 0
    em: float = 0.0
    f1: float = 0.0


@dataclass
class Summary:
    """Metrics of one run (EM/F1 as fractions in 0..1) and what was run."""

    n: int = 0
    em: float = 0.0
    f1: float = 0.0
    failures: int = 0  # questions whose run raised (InvalidQuestion, ModelError, ...)
    with_error: int = 0  # questions with any error, raised or recorded by the agent
    by_type: dict[str, Group] = field(default_factory=dict)
    by_hops: dict[str, Group] = field(default_factory=dict)
    latency_p50: float = 0.0
    latency_p90: float = 0.0
    tokens_per_question: float = 0.0
    prefilled_per_question: float | None = None  # prompt tokens no cache held; None: records predate the count
    llm_calls_per_question: float = 0.0
    llm_calls_cached_per_question: float | None = None  # calls the call cache answered; None: records predate it
    agent: str | None = None
    llm: str | None = None
    dataset: str | None = None
    file: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)  # corpus / graph used, whether ingested now
    wall_time: float | None = None  # seconds of the latest invocation
    repeats: str | None = None  # whether a rerun gives the same answers (eval/runner.repeats)
    diagnostics: dict[str, Any] = field(default_factory=dict)  # failure classes, evidence recall (diagnostics.py)
    health: dict[str, Any] = field(default_factory=dict)  # protocol health totals (health.py)
    routes: dict[str, Any] = field(default_factory=dict)  # auto: {"answered_by": {stage: n}, "decisions": {...: n}}
    paired: dict[str, Any] = field(default_factory=dict)  # compare(): against the first run (eval/paired.py)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Summary:
        data = dict(data)
        for key in ("by_type", "by_hops"):
            data[key] = {k: Group(**v) for k, v in data.get(key, {}).items()}
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def _ordered(keys: Any) -> list[str]:
    """Group names in order: numbers by value (hop counts), then the rest alphabetically."""
    return sorted(set(keys), key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k))


def prefilled_per_question(records: list[dict]) -> float | None:
    """Mean prompt tokens prefilled (not read from a cache) per question; None if a record has no cache count."""
    if not records or any("cached" not in (r.get("tokens") or {}) for r in records):
        return None
    return sum(r["tokens"]["input"] - r["tokens"]["cached"] for r in records) / len(records)


def summarize(records: Iterable[dict], **meta: Any) -> Summary:
    """The metrics of `records`, read once (a generator is never held: only sums, counts and the latencies);
    `meta` fills agent, llm, dataset, file, environment, wall_time."""
    n = failures = with_error = 0
    sums = dict.fromkeys(("em", "f1", "tokens", "calls", "prefilled", "from_cache"), 0.0)
    cached = counted = True
    latencies: list[float] = []
    groups: dict[str, dict[str, list[float]]] = {"type": {}, "hops": {}}  # name -> [n, em, f1]
    diagnostics, health = FailureTotals(), HealthTotals()
    answered: Counter = Counter()
    decisions: Counter = Counter()
    for r in records:
        n += 1
        failures += bool(r.get("failed"))
        with_error += bool(r.get("error"))
        sums["em"], sums["f1"] = sums["em"] + r["em"], sums["f1"] + r["f1"]
        tokens = r.get("tokens") or {}
        sums["tokens"] += tokens.get("total", 0)
        sums["calls"] += r.get("llm_calls", 0)
        counted = counted and "llm_calls_cached" in r
        sums["from_cache"] += r.get("llm_calls_cached", 0)
        cached = cached and "cached" in tokens
        if cached:
            sums["prefilled"] += tokens.get("input", 0) - tokens["cached"]
        latencies.append(r["latency"])
        for key in groups:
            g = groups[key].setdefault("-" if r.get(key) is None else str(r[key]), [0, 0.0, 0.0])
            g[0], g[1], g[2] = g[0] + 1, g[1] + r["em"], g[2] + r["f1"]
        diagnostics.add(r)
        health.add(r.get("health"))
        if isinstance(route := r.get("route"), dict):
            answered[route.get("answered_by") or "none"] += 1
            decisions.update(f"{d.get('stage')} {d.get('action')}: {d.get('reason')}"
                             for d in route.get("decisions") or [])

    def per(total: float) -> float:
        return total / n if n else 0.0

    def by(key: str) -> dict[str, Group]:
        return {k: Group(int(g[0]), g[1] / g[0], g[2] / g[0]) for k in _ordered(groups[key])
                for g in [groups[key][k]]}

    return Summary(
        n=n, em=per(sums["em"]), f1=per(sums["f1"]), failures=failures, with_error=with_error,
        by_type=by("type"), by_hops=by("hops"),
        latency_p50=percentile(latencies, 50), latency_p90=percentile(latencies, 90),
        tokens_per_question=per(sums["tokens"]),
        prefilled_per_question=per(sums["prefilled"]) if n and cached else None,
        llm_calls_per_question=per(sums["calls"]),
        llm_calls_cached_per_question=per(sums["from_cache"]) if n and counted else None,
        diagnostics=diagnostics.result(), health=health.result(),
        routes={"answered_by": dict(answered.most_common()), "decisions": dict(decisions.most_common())}
        if answered else {},
        **meta,
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def summary_table(summary: Summary, title: str | None = None) -> Table:
    """One run: overall and per type / hop count EM and F1 (in %), failures, latency, tokens."""
    table = Table(title=escape(title or f"{summary.agent} · {summary.dataset} · {Path(summary.file or '-').name}"))
    for col in ("group", "n", "EM", "F1"):
        table.add_column(col, justify="left" if col == "group" else "right")
    table.add_row("all", str(summary.n), _pct(summary.em), _pct(summary.f1), style="bold")
    for label, groups in (("type", summary.by_type), ("hops", summary.by_hops)):
        if list(groups) == ["-"]:  # the dataset has no such field
            continue
        for name, g in groups.items():
            table.add_row(f"{label}={escape(str(name))}", str(g.n), _pct(g.em), _pct(g.f1))  # a dataset's text
    routes = summary.routes or {}
    route = ("\nanswered by " + ", ".join(f"{k} {n}" for k, n in routes["answered_by"].items()) + "; " +
             ", ".join(f"{k} {n}" for k, n in routes["decisions"].items())) if routes else ""
    table.caption = (f"failures {summary.failures}, with error {summary.with_error}, latency p50 "
                     f"{summary.latency_p50:.2f}s p90 {summary.latency_p90:.2f}s, "
                     f"{summary.tokens_per_question:.0f} tokens{_prefilled(summary)} and "
                     f"{summary.llm_calls_per_question:.1f} LLM calls per question{_from_cache(summary)}"
                     + _diagnostics_caption(summary) + _guards_caption(summary) + route)
    return table


def _from_cache(summary: Summary) -> str:
    n = summary.llm_calls_cached_per_question
    return "" if n is None else f" ({n:.1f} from the call cache)"


def _prefilled(summary: Summary) -> str:
    n = summary.prefilled_per_question
    return "" if n is None else f" ({n:.0f} prompt tokens prefilled)"


def _guards_caption(summary: Summary) -> str:
    """The guards that fired (questions each), how many runs they changed and answers they replaced, and
    the model calls constrained to their format."""
    h = summary.health or {}
    fired = ", ".join(f"{name} {n}" for name, n in (h.get("guards") or {}).items())
    if not fired and not h.get("constrained"):
        return ""
    return (f"\nguards fired: {fired or 'none'} (changed {h.get('guard_changed', 0)} runs, replaced "
            f"{h.get('answer_guard', 0)} answers); {h.get('constrained', 0)} constrained model calls")


def _diagnostics_caption(summary: Summary) -> str:
    d = summary.diagnostics
    if not d.get("questions"):
        return ""
    recall = "-" if d.get("evidence_recall") is None else _pct(d["evidence_recall"])
    classes = ", ".join(f"{k} {d['failures'].get(k, 0)}" for k in FAILURE_CLASSES if d["failures"].get(k))
    return f"\nmisses: {classes or 'none'}; gold evidence seen {recall if recall == '-' else recall + '%'}"


# -- comparing runs --------------------------------------------------------------------------
def load_run(run_dir: str | Path) -> tuple[str, dict, list[dict]]:
    """(label, summary.json contents or {}, records) of a run folder; the label is the folder name."""
    run_dir = Path(run_dir)
    return run_dir.name, _meta(run_dir), read_records(run_dir / RESULTS, keep=SUMMARY_FIELDS)


def _meta(run_dir: Path) -> dict:
    meta_path = run_dir / SUMMARY
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
    return meta if isinstance(meta, dict) else {}


def compare(run_dirs: list[str | Path], target: float = 0.0) -> dict[str, Summary]:
    """label -> Summary of each run, restricted to the question ids present in every run. The records are
    streamed twice (their ids, then their metrics); what stays in memory is the ids and, per question, the
    F1 and cluster the paired comparison needs, not the records."""
    folders = [Path(d) for d in run_dirs]
    common = set.intersection(*({r["id"] for r in iter_records(d / RESULTS, keep=("id",))} for d in folders)) \
        if folders else set()
    out: dict[str, Summary] = {}
    first: list[dict] = []
    for folder in folders:
        label, meta = folder.name, _meta(folder)
        keep = {k: meta.get(k) for k in ("agent", "llm", "dataset", "file")}
        keep["llm"] = redact(keep["llm"]) if isinstance(keep["llm"], str) else keep["llm"]  # run folders of before
        while label in out:
            label += "'"
        pairs: list[dict] = []  # id, f1 and cluster of each shared question, for the paired comparison

        def shared(pairs: list[dict] = pairs, folder: Path = folder) -> Iterator[dict]:
            for r in iter_records(folder / RESULTS, keep=SUMMARY_FIELDS):
                if r["id"] in common:
                    pairs.append({"id": r["id"], "f1": r.get("f1"), "cluster": cluster_key(r)})
                    yield r

        out[label] = summarize(shared(), **keep)
        if first:
            out[label].paired = paired_comparison(first, pairs, target)
        else:
            first = pairs
    return out


def _panels() -> list[tuple[str, Any]]:
    """(name, summary -> {group: Group}) for the overall score and the per hop / type breakdowns."""
    return [("all", lambda s: {"all": Group(s.n, s.em, s.f1)}),
            ("hops", lambda s: s.by_hops), ("type", lambda s: s.by_type)]


def compare_table(summaries: dict[str, Summary]) -> Table:
    """Rows: metrics overall and per type / hop count; columns: runs (EM / F1 in %)."""
    runs = list(summaries.values())
    table = Table(title=f"{len(runs)} runs on the {runs[0].n if runs else 0} questions they share")
    table.add_column("metric")
    for label in summaries:
        table.add_column(escape(label), justify="right")  # folder names and model specs may hold [ ]
    table.add_row("agent", *[escape(str(s.agent or "-")) for s in runs])
    table.add_row("llm", *[escape(str(s.llm or "-")) for s in runs])
    table.add_row("failures", *[str(s.failures) for s in runs])
    if len(runs) > 1:
        first = escape(next(iter(summaries)))
        table.add_row(f"ΔF1 vs {first} [95% CI] (questions, clusters)",
                      *["-" if not s.paired else _delta(s.paired) for s in runs])
        target = next((s.paired.get("target", 0.0) for s in runs if s.paired), 0.0)
        table.add_row(f"≥ {first} {target:+.1f} by the CI (met, within noise, missed)",
                      *["-" if not s.paired else str(s.paired.get("verdict") or "no interval") for s in runs])
        table.add_row("smallest ΔF1 these questions detect (80% power)",
                      *["-" if not s.paired or s.paired.get("detectable") is None else f"{s.paired['detectable']:.1f}"
                        for s in runs])
    table.add_row("latency p50 / p90 (s)", *[f"{s.latency_p50:.2f} / {s.latency_p90:.2f}" for s in runs])
    table.add_row("LLM calls / question (from the call cache)", *[
        f"{s.llm_calls_per_question:.1f}" + ("" if s.llm_calls_cached_per_question is None
                                             else f" ({s.llm_calls_cached_per_question:.1f})") for s in runs])
    table.add_row("tokens / question", *[f"{s.tokens_per_question:.0f}" for s in runs])
    table.add_row("prompt tokens prefilled / question", *["-" if s.prefilled_per_question is None
                                                          else f"{s.prefilled_per_question:.0f}" for s in runs])
    if any(s.diagnostics.get("questions") for s in runs):
        table.add_row("gold evidence seen %", *["-" if s.diagnostics.get("evidence_recall") is None
                                                 else _pct(s.diagnostics["evidence_recall"]) for s in runs])
        for k in FAILURE_CLASSES:
            table.add_row(f"{k} misses", *[str(s.diagnostics.get("failures", {}).get(k, 0)) for s in runs])
        table.add_row("first missed hop (hop: questions)", *[_missed_hops(s) for s in runs])
    _route_rows(table, runs)
    for name, groups_of in _panels():
        keys = _ordered(k for s in runs for k in groups_of(s))
        for key in keys:
            cells = [groups_of(s).get(key) for s in runs]
            n = next((g.n for g in cells if g), 0)
            label = "EM / F1" if name == "all" else f"{name}={escape(str(key))} (n={n}) EM / F1"
            table.add_row(label, *[f"{_pct(g.em)} / {_pct(g.f1)}" if g else "-" for g in cells],
                          style="bold" if name == "all" else None)
    return table


def _delta(p: dict[str, Any]) -> str:
    ci = "" if p.get("df1_low") is None else f" [{p['df1_low']:+.1f}, {p['df1_high']:+.1f}]"
    return f"{p['df1']:+.1f}{ci} ({p['paired']}, {p['clusters']})"


def _route_rows(table: Table, runs: list[Summary]) -> None:
    """auto's stages and decisions, counted per run."""
    for key, label in (("answered_by", "answered by {}"), ("decisions", "{}")):
        names = list(dict.fromkeys(k for s in runs for k in (s.routes or {}).get(key, {})))
        for name in names:
            table.add_row(escape(label.format(name)), *[str((s.routes or {}).get(key, {}).get(name, 0)) for s in runs])


def _missed_hops(summary: Summary) -> str:
    missed = summary.diagnostics.get("first_missed_hop") or {}
    return ", ".join(f"{hop}: {n}" for hop, n in missed.items()) or "-"


def plot(summaries: dict[str, Summary], out: str | Path) -> Path:
    """A PNG with F1 (%) per run: overall, by hop count and by question type."""
    from ..plots import pyplot, save_png

    fig, axes = pyplot().subplots(1, 3, figsize=(15, 4.5))
    labels = list(summaries)
    width = 0.8 / max(1, len(labels))
    for ax, (name, groups_of) in zip(axes, _panels()):
        keys = _ordered(k for s in summaries.values() for k in groups_of(s))
        for i, label in enumerate(labels):
            groups = groups_of(summaries[label])
            values = [100 * groups[k].f1 if k in groups else 0.0 for k in keys]
            ax.bar([x + i * width for x in range(len(keys))], values, width, label=label)
        ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(keys))], keys, rotation=20)
        ax.set_title("F1 overall" if name == "all" else f"F1 by {name}")
        ax.set_ylim(0, 100)
    axes[0].set_ylabel("F1 (%)")
    axes[0].legend(fontsize="small")
    return save_png(fig, out)
