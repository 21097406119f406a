"""The agents bench/agents.py runs and their variants (`omne:guards=none`), and the questions each environment is
asked: what running the evals (bench/agents.py), their tables (bench/tables.py) and bench/confidence.py share."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from mhqa_graph.graphs import context_schema
from mhqa_graph.graphs.guards import GUARDS, selected

from mhqa_graph.eval.environments import DEV_ENVIRONMENTS
from mhqa_graph.eval.runner import load_questions

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
AGENTS = ("direct", "rag", "opera", "mujica", "omne", "auto")
KG_ONLY = {"omne"}  # agents that need a knowledge graph
DESIGNS = ("opera", "mujica", "omne")  # the multi-hop designs; rag is their baseline, auto composes them

DEFAULT_LIMIT = 20  # questions asked from --start without --slice or --limit
SEALED_N = 150  # per KG environment: 450 pooled detect 8.5 F1 points (docs/benchmarks.md, "How to read")
# (start, limit) per environment. Defaults are chosen on the validation slice; targets are read once from the
# sealed slice, with the frozen defaults (`--slice sealed` refuses any other variant unless `--unseal` says why).
# 2Wiki text has 145 questions: its validation slice is 140..144 and it has no sealed slice.
SLICES = {"validation": {env: (140, 60) for env in DEV_ENVIRONMENTS},
          "sealed": {"pq2h": (240, SEALED_N), "pq3h": (240, SEALED_N), "2wiki-kg": (240, SEALED_N),
                     "hotpot": (240, 60)}}

# variant key -> eval flag; any other key is a setting of the agent, given as `--set key=value`
SETTINGS = {"decoding": "--decoding", "guards": "--guards", "guard_mode": "--guard-mode"}


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    """`omne:guards=none;guard_mode=log` -> ("omne", {"guards": "none", "guard_mode": "log"})."""
    agent, _, rest = spec.partition(":")
    settings = dict(item.split("=", 1) for item in rest.split(";") if "=" in item)
    known = set(SETTINGS) | ({f.name for f in dataclasses.fields(context_schema(agent))} if agent in AGENTS else set())
    unknown = sorted(set(settings) - known)
    if agent not in AGENTS or unknown or (rest and not settings):
        raise ValueError(f"bad agent {spec!r}: use <agent>[:key=value;...] with agent in {', '.join(AGENTS)} "
                         f"and keys in {', '.join(SETTINGS)} or the agent's settings (`mhqa eval --set`)")
    return agent, settings


def split_agents(text: str) -> list[str]:
    """`rag,opera:guards=-unecho,-options_line` -> ["rag", "opera:guards=-unecho,-options_line"]: a comma starts a
    new variant only where an agent's name follows it."""
    variants: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if variants and part.partition(":")[0] not in AGENTS:
            variants[-1] += "," + part
        elif part:
            variants.append(part)
    return variants


def all_guards(agent: str) -> frozenset[str]:
    """The guards that apply to `agent`."""
    return frozenset(n for n, g in GUARDS.items() if agent in g.agents)


def guards_off(variant: str) -> tuple[str, frozenset[str]] | None:
    """(the variant this one differs from only in guards, the guards it turns off), if it only turns
    guards off; None otherwise (it turns none off, or logs instead of enforcing). `none` and `-name,...` are
    read against the default run, whatever the default set was when the two ran (run folders outlive a change
    of the default set): `none` turns off every guard of the agent, `-name` that guard."""
    agent, settings = parse_variant(variant)
    if "guards" not in settings or settings.get("guard_mode", "enforce") != "enforce":
        return None
    rest = {k: v for k, v in settings.items() if k != "guards"}
    names = [n.strip() for n in settings["guards"].split(",") if n.strip()]
    if settings["guards"] == "none":
        turned_off = all_guards(agent)
    elif names and all(n[0] in "+-" for n in names):
        turned_off = {n[1:] for n in names if n[0] == "-"}
    else:
        turned_off = selected("auto", agent) - selected(settings["guards"], agent)
    off = frozenset(n for n in turned_off if n in GUARDS and agent in GUARDS[n].agents)
    if not off:
        return None
    return agent + (":" + ";".join(f"{k}={v}" for k, v in rest.items()) if rest else ""), off


def asked_range(args: argparse.Namespace) -> str:
    """The questions asked, as the tables' headings say it."""
    chosen, limit = getattr(args, "slice", None), getattr(args, "limit", None)
    if chosen:
        most = max(n for _, n in SLICES[chosen].values())
        return f"the {chosen} slice" + (f", its first {limit} questions" if limit is not None and limit < most else "")
    return f"questions {args.start}..{args.start + (limit if limit is not None else DEFAULT_LIMIT) - 1}"


def asked_ids(args: argparse.Namespace, env: str) -> set[str]:
    """The ids of the environment's questions asked (`span`)."""
    spec, (start, limit) = DEV_ENVIRONMENTS[env], span(args, env)
    return {q.id for q in load_questions(spec.dataset, args.data / spec.file, limit=limit, start=start)}


def environments(args: argparse.Namespace) -> list[str]:
    """The environments asked: `--env`'s, else every one; with `--slice`, those the slice has."""
    envs = getattr(args, "env", None) or list(DEV_ENVIRONMENTS)
    chosen = getattr(args, "slice", None)
    return [env for env in envs if not chosen or env in SLICES[chosen]]


def slice_results(args: argparse.Namespace) -> Path:
    """The records folder of the asked questions: RESULTS/sealed for the sealed slice, else RESULTS."""
    return Path(args.results) / "sealed" if getattr(args, "slice", None) == "sealed" else Path(args.results)


def span(args: argparse.Namespace, env: str) -> tuple[int, int]:
    """(first question, how many) asked of `env`: its slice's (`--slice`; with `--limit`, its first questions),
    else `--start` and `--limit`."""
    chosen, limit = getattr(args, "slice", None), getattr(args, "limit", None)
    if not chosen:
        return args.start, limit if limit is not None else DEFAULT_LIMIT
    start, n = SLICES[chosen][env]
    return start, min(n, limit) if limit is not None else n
