"""Compact per-question records: what the tables read of an eval run, without its traces, one JSON line per
question, sorted by id, gzip'd without a timestamp (the same records give the same bytes). The benchmark commits
them (`bench/records.py`), and so does a learning run's dev slice (`DevConfig.records`):

    id, cluster (the gold path, else the id: eval/paired.cluster_key), prediction, em, f1, error, failed,
    latency (seconds), llm_calls, llm_calls_cached, tokens {input, output, total, cached}, health (protocol counts
    and guard firings), format_repairs, diagnostics (failure class, evidence recall), placeholders (OPERA), plan_size,
    carried, route (auto's stage and decisions, each decision's answer scored: f1)

`save` merges a run folder's records into a file (a question asked again replaces its record).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from .health import format_repairs
from .paired import cluster_key
from .report import RESULTS, read_records
from .scoring import score

SUFFIX = ".jsonl.gz"
KEPT = ("id", "prediction", "em", "f1", "error", "failed", "latency", "llm_calls", "llm_calls_cached", "tokens",
        "carried", "route", "confidence")
HEALTH = ("acted", "invented", "malformed", "repairs", "forced", "forced_by", "bad_answer", "guards", "guard_changed",
          "answer_guard", "constrained", "cache_errors")
DIAGNOSTICS = ("failure", "evidence_recall", "first_missed_hop")
MAX_ERROR_CHARS = 200


def compact(record: dict) -> dict:
    """What the tables read of one eval record (the benchmark's and a learning run's dev slice), without its trace."""
    out = {k: record[k] for k in KEPT if k in record}
    if isinstance(out.get("error"), str):
        out["error"] = out["error"][:MAX_ERROR_CHARS]
    out["cluster"] = cluster_key(record)
    out["health"] = {k: v for k, v in (record.get("health") or {}).items() if k in HEALTH}
    out["diagnostics"] = {k: v for k, v in (record.get("diagnostics") or {}).items() if k in DIAGNOSTICS}
    out["format_repairs"] = format_repairs(record)
    route, golds = out.get("route"), record.get("answers")
    if isinstance(route, dict) and golds:  # auto: how each stage's answer scored
        out["route"] = route | {"decisions": [d | {"f1": score(d.get("answer") or "", golds)[1]}
                                              for d in route.get("decisions") or []]}
    trace = record.get("trace") or {}
    placeholders = (trace.get("design") or {}).get("placeholders")
    if isinstance(placeholders, dict):
        out["placeholders"] = {k: placeholders.get(k, 0) for k in ("written", "resolved")}
    if trace.get("plan"):
        out["plan_size"] = len(trace["plan"])  # sub-goals or sub-questions planned
    return out


def load(path: Path) -> list[dict]:
    """The records of one file ([] if there is none)."""
    if not path.is_file():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write(path: Path, records: Iterable[dict]) -> None:
    """Write `records` sorted by id, atomically (a temporary file renamed over the old one)."""
    rows = sorted(records, key=lambda r: natural(str(r["id"])))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode("utf-8"))
    os.replace(tmp, path)


def natural(qid: str) -> tuple:
    """Ids in natural order: "pq2h-140" before "pq2h-1000"."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", qid))


def save(run_folder: Path, path: Path, stamp: dict | None = None) -> int:
    """Merge the records of an eval run folder into `path`; returns how many the file holds. `stamp`: fields the
    records new to the file carry (a sealed run's commit and settings digest)."""
    merged = {str(r["id"]): r for r in load(path)}
    for record in read_records(run_folder / RESULTS):
        qid, before = str(record["id"]), merged.get(str(record["id"]))
        kept = stamp if before is None else {k: before[k] for k in stamp or {} if k in before}  # stamped once
        merged[qid] = compact(record) | (kept or {})
    if merged:
        write(path, merged.values())
    return len(merged)
