"""The tables of bench/agents.py, from the committed records (bench/records.py); they run no model.

Per environment (`env_rows`, `markdown`, `plot`): every agent on the questions of the asked range that all of them
answered. Across environments (`summary`, the tables docs/benchmarks.md opens with): F1 and ΔF1 against `rag` per
environment and agent, what guards carry, what `auto` did, the targets met or missed, cost per question and
mechanisms against the runs without them. The metrics of a group of records are `eval/report.summarize`'s.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

import records as R
from mhqa_graph.graphs.auto import REASONS, reason_code
from mhqa_graph.graphs.guards import selected
from variants import AGENTS, DESIGNS, KG_ONLY, all_guards, asked_ids, asked_range, guards_off, parse_variant

from mhqa_graph.eval.diagnostics import FAILURE_CLASSES
from mhqa_graph.eval.environments import DEV_ENVIRONMENTS
from mhqa_graph.eval.health import format_repairs
from mhqa_graph.eval.paired import cluster_key, interval_and_detectable, paired_interval
from mhqa_graph.eval.paired import verdict as by_interval
from mhqa_graph.eval.report import summarize
from mhqa_graph.plots import pyplot, save_png


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def env_rows(args: argparse.Namespace, env: str, agents: list[str]) -> tuple[int, list[dict]]:
    """(questions of the asked range that all agents' runs answered, one row of metrics per agent over
    those questions). A run folder may hold more questions, from earlier runs over other ranges."""
    records = {a: {r["id"]: r for r in R.load(R.path_of(args.llm, env, a, args.results))} for a in agents}
    records = {a: r for a, r in records.items() if r}
    if not records:
        return 0, []
    shared = sorted(set.intersection(asked_ids(args, env), *(set(r) for r in records.values())))
    if not shared:
        return 0, []
    metrics = {a: summarize(by_id[i] for i in shared) for a, by_id in records.items()}
    rag = metrics.get("rag")
    rows = []
    for agent, by_id in records.items():
        recs, s = [by_id[i] for i in shared], metrics[agent]
        health, diags = s.health, s.diagnostics
        rows.append({
            "agent": agent, "n": s.n, "em": 100 * s.em, "f1": 100 * s.f1,
            "df1": None if rag is None else 100 * (s.f1 - rag.f1),
            "df1_ci": None if rag is None else paired_interval(
                [by_id[i]["f1"] - records["rag"][i]["f1"] for i in shared],
                clusters=[cluster_key(by_id[i]) for i in shared]),
            "sec": _mean([r["latency"] for r in recs]), "calls": s.llm_calls_per_question,
            "tokens": s.tokens_per_question,
            "acted": f"{health['acted']}/{health['acted_of']}" if health["acted_of"] else "-",
            "acted_pct": 100 * health["acted"] / health["acted_of"] if health["acted_of"] else None,
            "invented": health["invented"], "malformed": health["malformed"], "repairs": health["repairs"],
            "forced": health["forced"], "bad": health["bad_answers"],
            "guarded": health.get("guard_changed", 0), "answer_guard": health.get("answer_guard", 0),
            "fired": health.get("guards", {}),
            "recall": diags["evidence_recall"], "failures": diags["failures"], "fill": _fill(recs),
            "carried": sum(1 for r in recs if r.get("carried")),
            "guards_share": _guards_share(agent, by_id, records, shared),
        })
    return len(shared), rows


def _guards_share(variant: str, by_id: dict, records: dict, ids: list[str]) -> dict | None:
    """What the guards a variant turns off add to its default run (guards on minus off, per question): ΔF1 with
    its interval, questions better and worse, questions re-asked. None for other variants."""
    found = guards_off(variant)
    if not found or found[0] not in records:
        return None
    return {"off": ", ".join(sorted(found[1])), "base": found[0],
            **_share([(records[found[0]][i], by_id[i]) for i in ids])}


def _share(pairs: list[tuple[dict, dict]]) -> dict:
    """What guards add, from (guards on, guards off) records of the same questions: ΔF1 with its interval,
    questions better and worse with them, questions re-asked without them, calls and tokens per question."""
    diffs = [on["f1"] - off["f1"] for on, off in pairs]
    return {"n": len(pairs), "df1": 100 * _mean(diffs), "ci": paired_interval(diffs, clusters=_clusters(pairs)),
            "better": sum(d > 0 for d in diffs), "worse": sum(d < 0 for d in diffs),
            "reasked": sum(1 for _, off in pairs if not off.get("carried")),
            "calls": _mean([on["llm_calls"] - off["llm_calls"] for on, off in pairs]),
            "tokens": _mean([on["tokens"]["total"] - off["tokens"]["total"] for on, off in pairs])}


def _clusters(pairs: list[tuple[dict, dict]]) -> list[str]:
    """The cluster of each pair (eval/paired.cluster_key), by environment: `env` where the record says it."""
    return [f"{on.get('env', '')}/{cluster_key(on)}" for on, _ in pairs]


def _fill(records: list[dict]) -> str:
    """OPERA's placeholders resolved / written over the records ("-" for other agents)."""
    counts = [r.get("placeholders") for r in records]
    counts = [c for c in counts if isinstance(c, dict)]
    if not counts:
        return "-"
    return f"{sum(c.get('resolved', 0) for c in counts)}/{sum(c.get('written', 0) for c in counts)}"


def markdown(env: str, n: int, rows: list[dict], llm: str) -> str:
    spec = DEV_ENVIRONMENTS[env]
    head = (f"### {env}: {spec.dataset} `{Path(spec.file).name}` ({spec.kind}), {n} questions, `{llm}`\n\n"
            "| agent | EM | F1 | ΔF1 vs rag [95% CI] | s/q | LLM calls/q | tokens/q | acted | invented | malformed | "
            "repairs | forced | empty/long | guarded (answer) | evidence seen | "
            "misses (retrieval/reasoning/format/error) | placeholders filled |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        df1 = "-" if r["df1"] is None or r["agent"] == "rag" else f"{r['df1']:+.1f}{_interval(r['df1_ci'])}"
        recall = "-" if r["recall"] is None else f"{100 * r['recall']:.0f}%"
        misses = "/".join(str(r["failures"][k]) for k in FAILURE_CLASSES[:4])
        lines.append(f"| {r['agent']} | {r['em']:.1f} | {r['f1']:.1f} | {df1} | {r['sec']:.1f} | {r['calls']:.1f} | "
                     f"{r['tokens']:.0f} | {r['acted']} | {r['invented']} | {r['malformed']} | {r['repairs']} | "
                     f"{r['forced']} | {r['bad']} | {r['guarded']} ({r['answer_guard']}) | {recall} | {misses} | "
                     f"{r['fill']} |")
    shares = [r for r in rows if r["guards_share"]]
    if shares:  # each guards-off variant against its default: what those guards add
        lines += ["", "| guards off | their share: ΔF1 on - off [95% CI] | better / worse with them | re-asked "
                  "(the rest carried over) | calls/q, tokens/q they add |", "|---|---|---|---|---|"]
        for r in shares:
            g = r["guards_share"]
            lines.append(f"| {g['base']}: {g['off']} | {g['df1']:+.1f}{_interval(g['ci'])} | "
                         f"{g['better']} / {g['worse']} | {g['reasked']} | {g['calls']:+.2f}, {g['tokens']:+.0f} |")
    fired = sorted({name for r in rows for name in r["fired"]})
    if fired:  # questions each guard fired in, per variant
        lines += ["", "| agent | " + " | ".join(fired) + " |", "|---|" + "---|" * len(fired)]
        lines += [f"| {r['agent']} | " + " | ".join(str(r["fired"].get(n, 0)) for n in fired) + " |" for r in rows]
    return head + "\n".join(lines) + "\n"


def _interval(ci: tuple[float, float] | None) -> str:
    return f" [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else ""


PANELS = (("F1 (%)", "f1"), ("ΔF1 vs rag", "df1"), ("seconds per question", "sec"),
          ("LLM calls per question", "calls"), ("acted as designed (%)", "acted_pct"))


def plot(tables: dict[str, list[dict]], path: Path) -> None:
    """One row of panels per environment: F1 (EM as the hatched part of each bar), ΔF1 against rag,
    seconds and LLM calls per question, and the share of questions where the agent acted as designed."""
    envs = [e for e, rows in tables.items() if rows]
    if not envs:
        return
    fig, axes = pyplot().subplots(len(envs), len(PANELS), figsize=(3.6 * len(PANELS), 3 * len(envs)), squeeze=False)
    for row_axes, env in zip(axes, envs):
        rows = tables[env]
        names = [r["agent"] for r in rows]
        for ax, (label, key) in zip(row_axes, PANELS):
            ax.bar(names, [r[key] or 0.0 for r in rows], color="tab:blue")
            if key == "f1":
                ax.bar(names, [r["em"] for r in rows], color="tab:blue", alpha=0.6, hatch="//")
                ax.set_ylim(0, 100)
            if key == "df1":
                ax.axhline(0, color="black", linewidth=0.8)
            ax.set_title(f"{env} (n={rows[0]['n']}): {label}", fontsize=9)
            ax.tick_params(axis="x", rotation=30, labelsize=8)
    save_png(fig, path)


# -- summary across environments -------------------------------------------------------------------
AUTO_KG_GAIN, AUTO_TEXT_GAIN, AUTO_SLACK = 10.0, 0.0, 1.0  # auto >= rag + 10 pooled over the KG environments,
# rag + 0 (no loss) over the text ones, each by its interval's lower bound, and >= the best single design - 1 on each
MAX_CALLS_RATIO, MAX_SECONDS_RATIO = 3.0, 3.0  # auto's calls and seconds a question against rag's, pooled by question
TEXT_GAIN, MAX_FORCED, MAX_ONE_SUBGOAL, MAX_PROTOCOL_SHARE = 5.0, 25.0, 20.0, 1.0  # percent


def recorded_variants(args: argparse.Namespace, env: str) -> dict[str, Path]:
    """The variants with a records file for `env` (bench/records.py), named as `--agents` names them; a file whose
    name is no variant is left out."""
    found = {}
    for variant, path in R.variants(args.llm, env, args.results).items():
        try:
            parse_variant(variant)
        except ValueError:
            continue
        found[variant] = path
    return found


def _fired(record: dict) -> set[str]:
    return set((record.get("health") or {}).get("guards") or {})


def default_records(agent: str, runs: dict[str, dict[str, dict]]) -> tuple[dict[str, dict], dict[str, int]]:
    """The agent's records with today's default guards, by id, and how many came from each other run. They are
    its default run's, except on a question where a guard outside today's default set fired (the run was made
    under an older default set): that record comes from a run of the agent with those guards off and no default
    one off, if there is one; else the question is left out."""
    stages = DESIGNS if agent == "auto" else (agent,)  # auto runs the designs' guards, each with its defaults
    on, records, taken = set().union(*(selected("auto", a) for a in stages)), {}, {}
    for qid, record in runs.get(agent, {}).items():
        extra = _fired(record) - on
        if not extra:
            records[qid] = record
            continue
        for variant, other in sorted(runs.items()):
            found = guards_off(variant)
            if (found and found[0] == agent and extra <= found[1] and not found[1] & on and qid in other
                    and not _fired(other[qid]) - on):
                records[qid], taken[variant] = other[qid], taken.get(variant, 0) + 1
                break
    return records, taken


def _cell(agent: str, env: str, asked: set[str], runs: dict[str, dict[str, dict]]) -> dict:
    """One agent on one environment, over the asked questions its default records answer (k of n)."""
    if agent in KG_ONLY and DEV_ENVIRONMENTS[env].kind != "kg":
        return {"agent": agent, "env": env, "k": 0, "n": len(asked), "applies": False}
    records, taken = default_records(agent, runs)
    recs = [records[i] for i in sorted(records)]
    s = summarize(recs)
    return {"agent": agent, "env": env, "k": s.n, "n": len(asked), "applies": True, "records": records,
            "taken": taken, "f1": 100 * s.f1, "sec": _mean([r["latency"] for r in recs]),
            "calls": s.llm_calls_per_question, "tokens": s.tokens_per_question,
            "prefilled": s.prefilled_per_question, "malformed": s.health["malformed"],
            "llm_calls": sum(r["llm_calls"] for r in recs), "repairs": sum(format_repairs(r) for r in recs),
            "from_auto": sum(r.get("carried") == "auto" for r in recs)}


def summary_envs(args: argparse.Namespace, envs: list[str], agents: list[str]) -> dict[str, dict]:
    """Per environment: the asked ids, every variant's records of them ("runs"), and per agent a cell of its
    default records, their F1 and costs, and ΔF1 against rag with its paired-bootstrap interval where both
    answered every asked question ("cells")."""
    out = {}
    for env in envs:
        asked = asked_ids(args, env)
        runs = {v: {r["id"]: r | {"env": env} for r in R.load(path) if r["id"] in asked}
                for v, path in recorded_variants(args, env).items()}
        cells = {a: _cell(a, env, asked, runs) for a in agents}
        rag = cells.get("rag")
        for cell in cells.values():
            if rag and cell["agent"] != "rag" and cell["k"] == rag["k"] == len(asked) > 0:
                diffs = [cell["records"][i]["f1"] - rag["records"][i]["f1"] for i in sorted(asked)]
                clusters = [cluster_key(cell["records"][i]) for i in sorted(asked)]
                cell["df1"], cell["ci"] = 100 * _mean(diffs), paired_interval(diffs, clusters=clusters)
                cell["clusters"], cell["rag"] = len(set(clusters)), rag["records"]
        out[env] = {"asked": asked, "runs": runs, "cells": cells}
    return out


def _status(cell: dict) -> str | None:
    """"-" (the agent does not run there), "not run", "k of n", or None when every asked question is answered."""
    if not cell["applies"]:
        return "-"
    return "not run" if not cell["k"] else None if cell["k"] == cell["n"] else f"{cell['k']} of {cell['n']}"


def matrix_table(by_env: dict[str, dict], agents: list[str]) -> str:
    lines = ["| environment | questions (clusters) | " + " | ".join(agents) + " |", "|---|---|" + "---|" * len(agents)]
    notes = []
    for env, found in by_env.items():
        shown = []
        for cell in (found["cells"][a] for a in agents):
            text = _status(cell) or f"{cell['f1']:.1f}"
            shown.append(text + (f" ({cell['df1']:+.1f}{_interval(cell['ci'])})" if "df1" in cell else ""))
            notes += [f"- {cell['agent']} on {env}: {k} of {cell['n']} questions from `{v}` (a guard outside "
                      "today's default set fired on them in the default run)" for v, k in cell.get("taken", {}).items()]
            if cell.get("from_auto"):
                notes.append(f"- {cell['agent']} on {env}: {cell['from_auto']} of {cell['n']} questions from auto's "
                             f"{cell['agent']} stage (the same subgraph and settings; `from_auto`)")
        clusters = {cluster_key(r) for r in found["runs"].get("rag", {}).values()}
        lines.append(f"| {env} | {len(found['asked'])} ({len(clusters) if clusters else '-'}) | " + " | ".join(shown)
                     + " |")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def cost_table(by_env: dict[str, dict], agents: list[str]) -> str:
    lines = ["| environment | agent | questions | s/q | LLM calls/q | tokens/q | tokens prefilled/q |",
             "|---|---|---|---|---|---|---|"]
    cells = [found["cells"][a] for found in by_env.values() for a in agents if found["cells"][a]["k"]]
    for c in cells:
        prefilled = "-" if c["prefilled"] is None else f"{c['prefilled']:.0f}"
        lines.append(f"| {c['env']} | {c['agent']} | {_status(c) or c['n']} | {c['sec']:.1f} | {c['calls']:.1f} | "
                     f"{c['tokens']:.0f} | {prefilled} |")
    if any(c["prefilled"] is None for c in cells):
        lines += ["", "Tokens prefilled (prompt tokens not read from the prefix cache): \"-\" where the records do "
                  "not count the prompt tokens read from the cache (`tokens.cached`)."]
    return "\n".join(lines) + "\n"


def guards_table(by_env: dict[str, dict]) -> str | None:
    """Per guards-off variant, its share (guards on minus off) on each environment and pooled over their questions:
    an environment where its default run is complete and none of those guards fired counts as 0 on each question
    ("did not fire"); one without a complete pair of runs is left out of the pool."""
    keys = sorted({found for env in by_env.values() for v in env["runs"] if (found := guards_off(v))},
                  key=lambda k: (AGENTS.index(parse_variant(k[0])[0]), k[0], k[1] != all_guards(k[0]), sorted(k[1])))
    if not keys:
        return None
    lines = ["| guards off | " + " | ".join(by_env) + " | pooled: share [95% CI], better / worse, questions | "
             "calls/q, tokens/q they add |", "|---|" + "---|" * (len(by_env) + 2)]
    for base, off in keys:
        shown, pairs = [], []
        for found in by_env.values():
            runs, ids = found["runs"], sorted(found["asked"])
            on = runs.get(base, {})
            variant = next((v for v in sorted(runs) if guards_off(v) == (base, off)), None)
            without = runs.get(variant, {})
            if len(on) < len(ids):
                shown.append(f"default run {len(on)} of {len(ids)}" if on else "not run")
            elif not variant and not off & set().union(*map(_fired, on.values())):
                shown.append("did not fire")
                pairs += [(on[i], on[i] | {"carried": base}) for i in ids]
            elif len(without) < len(ids):
                shown.append(f"{len(without)} of {len(ids)}" if without else "not run")
            else:
                share = _share([(on[i], without[i]) for i in ids])
                shown.append(f"{share['df1']:+.1f} ({share['better']}/{share['worse']}, {share['reasked']} re-asked)")
                pairs += [(on[i], without[i]) for i in ids]
        g = _share(pairs) if pairs else None
        pooled = (f"{g['df1']:+.1f}{_interval(g['ci'])}, {g['better']} / {g['worse']}, {g['n']} | "
                  f"{g['calls']:+.2f}, {g['tokens']:+.0f}") if g else "- | -"
        label = "all" if off == all_guards(base) else ", ".join(sorted(off))
        lines.append(f"| {base}: {label} | " + " | ".join(shown) + f" | {pooled} |")
    return "\n".join(lines) + "\n"


def _gain_target(cells: list[dict], gain: float) -> tuple[str, str]:
    """Every cell ΔF1 >= gain, each read from its interval (met: its lower bound clears `gain`; missed: its upper
    bound is below it; else within noise): the verdict, and where each cell stands."""
    def said(c: dict) -> str:
        if "df1" not in c:
            return f"{c['agent']} on {c['env']} {_status(c) or 'without a complete rag run'}"
        return f"{c['agent']} on {c['env']} {c['df1']:+.1f}{_interval(c['ci'])}"

    read = {id(c): _read(c.get("df1"), c.get("ci"), gain) for c in cells}
    groups = {v: [c for c in cells if read[id(c)] == v] for v in ("met", "within noise", "missed", "not measured")}
    verdict = _overall(list(read.values())) if cells else "not measured"
    measured = len(cells) - len(groups["not measured"])
    parts = [f"met {len(groups['met'])} of {measured} measured" * bool(measured)] + [
        f"{v}: " + ", ".join(map(said, groups[v])) for v in groups if groups[v]]
    return verdict, "; ".join(p for p in parts if p)


def _read(df1: float | None, ci: tuple[float, float] | None, target: float) -> str:
    """A ΔF1 against `target` by its interval (`by_interval`); "not measured" without a ΔF1, by the point estimate
    (an interval of one point) where the questions give no interval."""
    return "not measured" if df1 is None else by_interval(*(ci or (df1, df1)), target)


def _overall(verdicts: list[str]) -> str:
    """A target over several cells: missed if one is, not measured if one is, within noise if one is, else met."""
    return next((v for v in ("missed", "not measured", "within noise") if v in verdicts), "met")


def pooled(cells: list[dict]) -> dict | None:
    """ΔF1 against rag pooled over the questions of `cells` (each complete beside a complete rag), with the
    interval of a bootstrap over clusters (gold paths; questions elsewhere) within each environment."""
    done = [c for c in cells if "df1" in c]
    if not done or len(done) < len(cells):
        return None
    pairs = [(c["records"][i], c["rag"][i]) for c in done for i in sorted(c["records"])]
    diffs = [a["f1"] - b["f1"] for a, b in pairs]
    clusters = _clusters(pairs)
    ci, smallest = interval_and_detectable(diffs, clusters)
    return {"df1": 100 * _mean(diffs), "ci": ci, "n": len(diffs), "clusters": len(set(clusters)),
            "detectable": smallest}


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else "met" if ok else "missed"


def auto_rows(by_env: dict[str, dict]) -> list[tuple[str, str, str]]:
    """auto's targets: against the best single design per environment, against rag pooled by kind, its cost."""
    rows = []
    autos = {env: f["cells"]["auto"] for env, f in by_env.items() if "auto" in f["cells"]}
    stands, reads = [], []
    for env, cell in autos.items():
        designs = [c for a, c in by_env[env]["cells"].items() if a in DESIGNS and c["applies"] and c["k"] == c["n"]]
        if not cell["k"] or cell["k"] < cell["n"] or not designs:
            stands.append(f"{env}: {'auto ' + (_status(cell) or '') if cell['k'] < cell['n'] else 'no design run'}")
            reads.append("not measured")
            continue
        best = max(designs, key=lambda c: c["f1"])
        ids = sorted(cell["records"])
        diffs = [cell["records"][i]["f1"] - best["records"][i]["f1"] for i in ids]
        df1, ci = 100 * _mean(diffs), paired_interval(diffs, clusters=[cluster_key(cell["records"][i]) for i in ids])
        reads.append(_read(df1, ci, -AUTO_SLACK))
        stands.append(f"{env}: {cell['f1']:.1f} vs {best['agent']} {best['f1']:.1f} ({df1:+.1f}{_interval(ci)})")
    rows.append(("`auto` ≥ the best single design − 1 F1 on every environment (by the interval's lower bound)",
                 _overall(reads), "; ".join(stands)))
    for kind, gain in (("kg", AUTO_KG_GAIN), ("text", AUTO_TEXT_GAIN)):
        cells = [c for env, c in autos.items() if DEV_ENVIRONMENTS[env].kind == kind]
        p = pooled(cells) if cells else None
        said = "not measured" if p is None else (
            f"{p['df1']:+.1f}{_interval(p['ci'])} over {p['n']} questions in {p['clusters']} clusters; these "
            f"questions detect {p['detectable']:.1f} points" if p["detectable"] is not None else
            f"{p['df1']:+.1f} over {p['n']} questions")
        rows.append((f"`auto` ≥ `rag`{f' + {gain:g}' if gain else ''}, pooled over the "
                     f"{kind.upper() if kind == 'kg' else kind} "
                     "environments (by the interval's lower bound)",
                     "not measured" if p is None else by_interval(*(p["ci"] or (None, None)), gain) or "no interval",
                     said))
    ratios = []
    for env, cell in autos.items():
        rag = by_env[env]["cells"].get("rag")
        if cell["k"] and rag and rag["k"] and rag["calls"] and rag["sec"]:
            own = _rag_stage_seconds(cell)
            ratios.append((env, cell["calls"] / rag["calls"], cell["sec"] / (own or rag["sec"]), _escalated(cell),
                           own is not None))
    if ratios:
        calls, secs = pooled_cost(by_env, list(autos))
        ok = calls <= MAX_CALLS_RATIO and secs <= MAX_SECONDS_RATIO
        envs = f"{len(ratios)} environment" + "s" * (len(ratios) != 1)
        timed = sum(r[4] for r in ratios)
        against = ("its own `rag` stage's, timed in the same run" if timed == len(ratios) else
                   "`rag`'s run" if not timed else f"its own `rag` stage's in {timed}, `rag`'s run elsewhere")
        stands = (f"pooled by question over {envs}: {calls:.2f}× calls, {secs:.2f}× seconds (against {against}); " +
                  ", ".join(f"{e} {c:.2f}× / {t:.2f}×{why}" for e, c, t, why, _ in ratios))
        rows.append((f"`auto`: at most {MAX_CALLS_RATIO:g}× `rag`'s LLM calls and {MAX_SECONDS_RATIO:g}× its seconds",
                     _verdict(ok if len(ratios) == len(autos) else None), stands))
    return rows


def pooled_cost(by_env: dict[str, dict], envs: list[str]) -> tuple[float, float]:
    """auto's LLM calls and seconds against rag's, pooled by question over `envs` (each question weighs the same,
    not each environment): total calls over rag's on the same questions, and total seconds over its own `rag`
    stage's where every record timed it, else over `rag`'s run."""
    calls = rag_calls = secs = rag_secs = 0.0
    for env in envs:
        cell, rag = by_env[env]["cells"]["auto"], by_env[env]["cells"].get("rag")
        if not (rag and rag.get("records")):
            continue
        ids = sorted(set(cell["records"]) & set(rag["records"]))
        own = _rag_stage_seconds(cell)
        for i in ids:
            a, r = cell["records"][i], rag["records"][i]
            calls, rag_calls = calls + (a.get("llm_calls") or 0), rag_calls + (r.get("llm_calls") or 0)
            secs, rag_secs = secs + a["latency"], rag_secs + (_stage_seconds(a) if own is not None else r["latency"])
    return calls / max(rag_calls, 1.0), secs / max(rag_secs, 1e-9)


def _rag_stage_seconds(cell: dict) -> float | None:
    """The mean seconds of auto's own `rag` stage (the same subgraph and settings as `rag`), when every record
    says: the baseline of auto's seconds measured in the same run, on the same machine."""
    stages = [_stage_seconds(r) for r in cell["records"].values()]
    return _mean(stages) if stages and None not in stages else None


def _stage_seconds(record: dict) -> float | None:
    """The seconds of auto's own `rag` stage in one record, None where the record does not say."""
    return next((s["seconds"] for s in (record.get("route") or {}).get("stages") or [] if s.get("stage") == "rag"
                 and s.get("seconds") is not None), None)


def _escalated(cell: dict) -> str:
    """" (55 of 60 escalated, 5.9 calls each)": where auto's cost goes; "" when its records hold no route."""
    routes = [r for r in cell["records"].values() if (r.get("route") or {}).get("decisions")]
    if not routes:
        return ""
    up = [r for r in routes if _judged(r).get("action") == "escalate"]
    each = f", {_mean([r.get('llm_calls') or 0 for r in up]):.1f} calls each" if up else ""
    return f" ({len(up)} of {len(routes)} escalated{each})"


def share_row(by_env: dict[str, dict], agent: str, envs: tuple[str, ...], label: str, most: float,
              count: Any, kinds: Any = None) -> tuple[str, str, str] | None:
    """A target on the share of an agent's questions that `count(record)` holds (at most `most` percent); with
    `kinds(record)` (a list, None where a record does not say), those questions counted by kind."""
    cells = [f["cells"][agent] for env, f in by_env.items() if agent in f["cells"] and (not envs or env in envs)
             and f["cells"][agent]["k"]]
    if not cells:
        return None
    parts, ok = [], True
    for c in cells:
        held = [r for r in c["records"].values() if count(r)]
        ok &= 100 * len(held) <= most * c["k"]
        parts.append(f"{c['env']} {len(held)} of {c['k']}{_by_kind(held, kinds)}")
    return label, _verdict(ok), ", ".join(parts)


def _by_kind(records: list[dict], kinds: Any) -> str:
    """" (NoProgress 30, RoundCap 14)": the records counted by `kinds(record)`; "" when no record says."""
    said = [k for r in records if (k := kinds(r) if kinds else None) is not None]
    if not said:
        return ""
    counts = Counter(kind for k in said for kind in (k or ["none said"]))
    unsaid = len(records) - len(said)
    return " (" + ", ".join([f"{k} {n}" for k, n in sorted(counts.items())]
                            + ([f"not recorded {unsaid}"] if unsaid else [])) + ")"


def targets_table(by_env: dict[str, dict], agents: list[str]) -> str:
    """The targets of issue 42, met or missed and by how much."""
    rows = auto_rows(by_env) if "auto" in agents else []
    designs = [a for a in DESIGNS if a in agents]
    kg = [found["cells"][a] for env, found in by_env.items() for a in designs
          if DEV_ENVIRONMENTS[env].kind == "kg" and found["cells"][a]["k"]]
    if kg:
        rows.append(("every design ≥ `rag` on each KG environment (by the interval's lower bound)",
                     *_gain_target(kg, 0.0)))
    best = []  # per text environment, its best measured design
    for env, found in by_env.items():
        if DEV_ENVIRONMENTS[env].kind == "text":
            done = [found["cells"][a] for a in designs if "df1" in found["cells"][a]]
            best += [max(done, key=lambda c: c["df1"])] if done else []
    if best:
        rows.append((f"the best design ≥ `rag` + {TEXT_GAIN:.0f} on each text environment (by the interval's "
                     "lower bound)",
                     *_gain_target(best, TEXT_GAIN)))
    for row in (share_row(by_env, "mujica", (), f"Mujica: forced answers ≤ {MAX_FORCED:.0f}% of questions", MAX_FORCED,
                          lambda r: (r.get("health") or {}).get("forced"),
                          lambda r: (r.get("health") or {}).get("forced_by")),
                share_row(by_env, "opera", ("pq2h",), f"OPERA: one-sub-goal plans on two-hop PathQuestion ≤ "
                          f"{MAX_ONE_SUBGOAL:.0f}%", MAX_ONE_SUBGOAL, lambda r: r.get("plan_size") == 1,
                          lambda r: ["answered right" if (r.get("em") or 0) >= 1 else "answered wrong"])):
        if row:
            rows.append(row)
    runs = [c for found in by_env.values() for c in found["cells"].values() if c["k"]]
    ok = all(c["malformed"] == 0 and 100 * c["repairs"] <= MAX_PROTOCOL_SHARE * c["llm_calls"] for c in runs)
    per_agent = {a: [c for c in runs if c["agent"] == a] for a in agents}
    repairs = [f"{a} {sum(c['repairs'] for c in cs)} of {sum(c['llm_calls'] for c in cs)}"
               for a, cs in per_agent.items() if cs]
    stands = (f"malformed runs: {sum(c['malformed'] for c in runs)} of {sum(c['k'] for c in runs)} questions; "
              f"format-repair calls: {', '.join(repairs)}")
    worst = max(runs, key=lambda c: c["repairs"] / max(c["llm_calls"], 1), default=None)
    if worst:
        stands += (f"; the highest share in one run: {worst['agent']} on {worst['env']}, {worst['repairs']} of "
                   f"{worst['llm_calls']} ({100 * worst['repairs'] / max(worst['llm_calls'], 1):.1f}%)")
    rows.append((f"no malformed runs; repairs ≤ {MAX_PROTOCOL_SHARE:.0f}% of calls (each run)", _verdict(ok), stands))
    return "\n".join(["| target | verdict | where it stands |", "|---|---|---|"] +
                     [f"| {t} | **{v}** | {s} |" for t, v, s in rows]) + "\n"


def routes_table(by_env: dict[str, dict]) -> str | None:
    """`auto` and each of its variants per environment: questions that stopped at the first answer, escalated, and
    how each escalation ended; F1 of each group, and of the first answers where it escalated (records that score
    each decision's answer); the reasons, counted."""
    rows = []
    for env, found in by_env.items():
        for variant, by_id in found["runs"].items():
            if (variant != "auto" and not variant.startswith("auto:")) or not by_id:
                continue
            rows.append(_route_row(env, variant, list(by_id.values())))
    if not rows:
        return None
    return "\n".join(["| environment | agent | questions | stopped at rag (F1) | escalated (rag's F1 on them) | "
                      "the design answered (F1) | fell back to rag (F1) | why it escalated |",
                      "|---|---|---|---|---|---|---|---|", *rows]) + "\n"


def _judged(record: dict) -> dict:
    """auto's judgement of its first answer: the record's first decision that stops or escalates ({} if none)."""
    return next((d for d in (record.get("route") or {}).get("decisions") or []
                 if d.get("action") in ("stop", "escalate")), {})


def _route_row(env: str, variant: str, recs: list[dict]) -> str:
    decisions = [(r.get("route") or {}).get("decisions") or [] for r in recs]
    judged = [_judged(r) for r in recs]
    stopped = [r for r, j in zip(recs, judged) if j.get("action") == "stop"]
    escalated = [(r, d) for r, d, j in zip(recs, decisions, judged) if j.get("action") == "escalate"]
    took = [r for r, d in escalated if d[-1].get("action") == "answer"]
    agree = sum(1 for _, d in escalated if reason_code(d[-1]) == "agrees_with_rag")
    back = [r for r, d in escalated if d[-1].get("action") == "fallback"]
    first = [d[0]["f1"] for _, d in escalated if "f1" in d[0]]
    reasons: dict[str, int] = {}
    for j in judged:
        if j.get("action") == "escalate":
            why = REASONS.get(reason_code(j) or "", str(j.get("reason")))
            reasons[why] = reasons.get(why, 0) + 1

    def f1(group: list[dict]) -> str:
        return f"{100 * _mean([r['f1'] for r in group]):.1f}" if group else "-"

    scored = f"{100 * _mean(first):.1f}" if escalated and len(first) == len(escalated) else "-"
    return (f"| {env} | `{variant}` | {len(recs)} | {len(stopped)} ({f1(stopped)}) | {len(escalated)} ({scored}) | "
            f"{len(took)} ({f1(took)}; {agree} agree with rag) | {len(back)} ({f1(back)}) | "
            + ", ".join(f"{k} {n}" for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])) + " |")


def mechanisms_table(args: argparse.Namespace, envs: list[str], pairs: list[tuple[str, str]]) -> str | None:
    """Each (before, after) pair of variants on the questions both answered, per environment: F1 and ΔF1 [95%
    interval over clusters], calls and seconds a question, the share of forced answers, and of plans of one
    sub-goal or sub-question in all; None without pairs."""
    rows = ["| before → after | environment | questions (clusters) | F1 | ΔF1 [95% CI] | LLM calls/q | s/q | "
            "forced answers | one-step plans |", "|---|---|---|---|---|---|---|---|---|"]
    for before, after in pairs:
        for env in envs:
            runs = [{r["id"]: r for r in R.load(R.path_of(args.llm, env, v, args.results))} for v in (before, after)]
            ids = sorted(asked_ids(args, env) & set(runs[0]) & set(runs[1]))
            if not ids:
                continue
            a, b = ([run[i] for i in ids] for run in runs)
            diffs = [y["f1"] - x["f1"] for x, y in zip(a, b)]
            clusters = [cluster_key(x) for x in a]

            def cell(key: Any, digits: int = 1, runs: tuple = (a, b)) -> str:
                return " → ".join(f"{_mean([key(r) for r in recs]):.{digits}f}" for recs in runs)

            forced = " → ".join(f"{sum(bool((r.get('health') or {}).get('forced')) for r in recs)} of {len(ids)}"
                                for recs in (a, b))
            one_step = " → ".join(f"{sum(r.get('plan_size') == 1 for r in recs)} of {len(ids)}"
                                  if any(r.get("plan_size") is not None for r in recs) else "-" for recs in (a, b))
            ci = _interval(paired_interval(diffs, clusters=clusters))
            rows.append(f"| `{before}` → `{after}` | {env} | {len(ids)} ({len(set(clusters))}) | "
                        f"{cell(lambda r: 100 * r['f1'])} | {100 * _mean(diffs):+.1f}{ci} | "
                        f"{cell(lambda r: r['llm_calls'], 2)} | {cell(lambda r: r['latency'])} | {forced} | "
                        f"{one_step} |")
    return "\n".join(rows) if len(rows) > 2 else None


def summary(args: argparse.Namespace, envs: list[str], agents: list[str]) -> str:
    """The tables that docs/benchmarks.md opens with, from the records of `args.results`; runs no model. With
    `--only-mechanisms`, the mechanisms table alone, without its heading (a slice on which only the pairs ran)."""
    if getattr(args, "only_mechanisms", False):
        return mechanisms_table(args, envs, _pairs(args)) or "no records of these pairs in this range"
    if getattr(args, "only_routes", False):
        return routes_table(summary_envs(args, envs, [])) or "no records of auto in this range"
    by_env = summary_envs(args, envs, agents)
    agents = [a for a in agents if a == "rag" or a in DESIGNS or any(f["cells"][a]["k"] for f in by_env.values())]
    text = [f"## Across environments: `{args.llm}`, {asked_range(args)}\n",
            "### Which agent where\n", "F1, and ΔF1 against `rag` on the same questions [95% interval of a paired "
            "bootstrap over clusters: questions that share a gold path are drawn together], with the default guards; "
            "a run that has not answered every question says how many it has.\n", matrix_table(by_env, agents)]
    for kind in ("kg", "text"):
        table = guards_table({e: f for e, f in by_env.items() if DEV_ENVIRONMENTS[e].kind == kind})
        if table:
            text += [f"### What the guards carry: {kind} environments\n", "Guards on minus off, per question; "
                     "re-asked: the questions asked again without them (the rest carried over).\n", table]
    routes = routes_table(by_env) if "auto" in agents else None
    if routes:
        text += ["### What `auto` did\n", "Per environment and variant: where it stopped at `rag` (its answer "
                 "supported by its evidence) and where it escalated to the design, with the F1 of each group and of "
                 "`rag`'s answers where it escalated.\n", routes]
    text += ["### Targets\n", targets_table(by_env, agents), "### Cost per question\n", cost_table(by_env, agents)]
    table = mechanisms_table(args, envs, _pairs(args))
    if table:
        text += ["### Mechanisms: each against the run without it\n", "Paired on the questions both runs "
                 "answered (a later slice may be in one run only); forced answers: questions whose design was told "
                 "to answer now (a cap, or a planner round that planned nothing to run); one-step plans: questions "
                 "whose whole plan was one sub-goal or sub-question.\n", table]
    return "\n".join(text)


def _pairs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The (before, after) variants of `--mechanism`."""
    return [tuple(pair) for pair in getattr(args, "mechanism", None) or []]
