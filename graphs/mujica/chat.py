"""The Mujica planner's conversation: the plan's progress and the workers' answers as it sees them, its
earlier turns kept as what it did, the whole fitted to a character budget."""

from __future__ import annotations

import json

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from mhqa_graph.messages import FORCED, tagged
from mhqa_graph.parsing import strip_think, think_text
from mhqa_graph.tools import cap_text

from . import prompts as P
from .plan import ANSWERED, FAILED, UNKNOWN, SubQuestion, status

EVIDENCE_CONTEXTS = 3  # selected contexts of a sub-question shown to the planner

EVIDENCE_CHARS = 300  # of each

THOUGHT_CHARS = 300  # of the planner's reasoning kept in its conversation


def outcome(r: dict) -> str:
    if r["status"] == ANSWERED:
        return r["answer"]
    return P.UNKNOWN if r["status"] == UNKNOWN else P.FAILED


def progress(dag: list[SubQuestion], results: dict[str, dict]) -> str:
    """The plan as the planner sees it: each sub-question with its answer, or why it has none, or its wait."""
    by_id, lines = {q["id"]: q for q in dag}, []
    for q in dag:
        if status(q, results) is not None:
            r = results[q["id"]]
            lines.append(f"{q['id']}: {r['query']} -> {outcome(r)}")
            continue
        after = f" (after {', '.join(q['depends_on'])})" if q["depends_on"] else ""
        missing = [d for d in q["depends_on"] if d in by_id and status(by_id[d], results) in (UNKNOWN, FAILED)]
        wait = P.BLOCKED.format(ids=", ".join(missing)) if missing else P.WAITING
        lines.append(f"{q['id']}: {q['question']}{after} -> {wait}")
    return "\n".join(lines) or P.NO_PROGRESS


def table(dag: list[SubQuestion], results: dict[str, dict]) -> str:
    """The plan as a table (`cite_answers`): each sub-question with its answer, or why it has none, and the first
    context its worker selected (or retrieved, for one it could not answer)."""
    def cell(text: str) -> str:
        return " ".join(text.replace("|", "/").split())

    by_id, rows = {q["id"]: q for q in dag}, []
    for q in dag:
        if status(q, results) is not None:
            r = results[q["id"]]
            evidence = cap_text(r["evidence"][0], P.TABLE_EVIDENCE_CHARS) if r.get("evidence") else ""
            rows.append(f"| {q['id']} | {cell(r['query'])} | {cell(outcome(r))} | {cell(evidence)} |")
            continue
        missing = [d for d in q["depends_on"] if d in by_id and status(by_id[d], results) in (UNKNOWN, FAILED)]
        wait = P.BLOCKED.format(ids=", ".join(missing)) if missing else P.WAITING
        rows.append(f"| {q['id']} | {cell(q['question'])} | {wait} | |")
    return "\n".join([P.TABLE_HEAD, *rows]) if rows else P.NO_PROGRESS


def best_effort(results: dict[str, dict]) -> str:
    """The last worker answer in plan order, or ""."""
    return next((r["answer"] for r in reversed(results.values()) if r["status"] == ANSWERED), "")

# -- the planner's conversation --------------------------------------------------------------
def report(results: dict[str, dict], since_wave: int) -> tuple[str, str]:
    """The workers' answers since wave `since_wave`, with the contexts they selected (or, for a sub-question
    they could not answer, retrieved: the `unknown_contexts` guard), and the same without the contexts (how
    older rounds are summarised)."""
    full, brief = [], []
    for r in results.values():
        if r["wave"] <= since_wave:
            continue
        line = f"{r['id']}: {r['query']} -> {outcome(r)}"
        brief.append(line)
        label = P.SELECTED if r.get("selected") else P.RETRIEVED  # no selected context: unknown_contexts
        full += [line] + [f"  {label}: {e}" for e in r.get("evidence", [])]
    if not brief:
        return "", ""
    return P.REPORT.format(answers="\n".join(full)), P.REPORT.format(answers="\n".join(brief))


def conversation(log: list[dict], news: tuple[str, str], ask: str, budget: int, system: str = P.PLANNER_SYSTEM,
                 final: bool = False) -> tuple[list[BaseMessage], str]:
    """The planner's chat: the `system` prompt, each earlier round (its prompt and what it did), then this round's
    prompt: the workers' news (in full, or summarised) and `ask` (a `forced` message when `final`). Over `budget`
    characters, older rounds' prompts give way to their summaries (oldest first), then the oldest rounds after
    the first are left out, then this round's news is summarised, then cut. Returns the messages and this
    round's prompt."""
    turns = [[e["prompt"], e["brief"], e["reply"]] for e in log if e.get("reply")]
    prompt = news[0] + ask

    def size() -> int:
        return len(system) + len(prompt) + sum(len(t[0]) + len(t[2]) for t in turns)

    for turn in turns[1:]:
        if size() <= budget:
            break
        turn[0] = turn[1]
    while size() > budget and len(turns) > 1:
        del turns[1]
    if size() > budget:
        prompt = news[1] + ask
    if size() > budget:
        prompt = cap_text(news[1], max(100, budget - size() + len(news[1]))) + "\n\n" + ask
    messages: list[BaseMessage] = [SystemMessage(system)]
    for text, _, reply in turns:
        messages += [HumanMessage(text), AIMessage(reply)]
    return messages + [tagged(FORCED, prompt) if final else HumanMessage(prompt)], prompt


def said(thought: str, action: dict, think: bool) -> str:
    """The planner's turn as its conversation keeps it: what was done (the sub-questions sent to workers
    after repairs, or the answer), after its reasoning cut to `THOUGHT_CHARS`. A reply that was refused
    or repaired ("No" before any worker answered, a copied progress line) is not shown back to the planner
    as its own words, and runaway reasoning does not fill the budget."""
    done = json.dumps(action, ensure_ascii=False)
    return f"<think>{cap_text(thought, THOUGHT_CHARS)}</think>\n{done}" if think and thought else done


def thought_of(raw: str) -> str:
    """The planner's reasoning: its <think> block, else the prose before its JSON."""
    return think_text(raw) or strip_think(raw).split("{")[0].split("```")[0].strip()
