"""Schema-free knowledge-graph construction from a passage corpus with a chat model (LightRAG-style).

The model is asked for one triple per line, `subject | relation | object`. The parser is
tolerant: it strips bullets, numbering, brackets, quotes and `<think>` blocks, and skips any
line that is not three non-empty, reasonably short parts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage

from ..errors import InvalidInput
from ..store.base import KnowledgeStore
from ..types import Passage, Triple

EXTRACT_PROMPT = """Extract the facts stated in the passage below as a knowledge graph.
Write one fact per line, in the form
subject | relation | object
Rules:
- subject and object are entities, dates or values, named in full (no pronouns; write the \
full name instead of "he", "it", "the film").
- relation is a short lower-case phrase, e.g. "born in", "director", "capital of", "date of birth".
- Write only the fact lines, nothing else.

Title: {title}
Passage: {text}

Facts:"""

MAX_PART_CHARS = 120  # a longer subject, relation or object is a sentence, not a name
MAX_ERRORS = 20

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)
_BULLET = re.compile(r"^\s*(?:[-*•+>]+\s*|\d+[.):]\s+|\(\d+\)\s*)")
_QUOTES = "\"'`“”‘’«» "
_HEADER = ("subject", "relation", "object")


@dataclass
class ExtractReport:
    passages: int = 0
    failed: int = 0  # passages whose model call raised
    triples_seen: int = 0
    triples_added: int = 0
    lines_skipped: int = 0
    errors: list[str] = field(default_factory=list)  # the first MAX_ERRORS model errors


def _part(text: str) -> str:
    return text.strip().strip(_QUOTES).strip()


def parse_triples(text: str) -> tuple[list[Triple], int]:
    """Triples in a model's answer and the number of non-empty lines that were not one."""
    triples: list[Triple] = []
    skipped = 0
    for line in _THINK.sub("", text).splitlines():
        line = _BULLET.sub("", line).strip().rstrip(";,")
        if not line:
            continue
        if line[0] + line[-1] in ("()", "[]", "{}", "<>"):
            line = line[1:-1]
        parts = [_part(p) for p in line.strip().strip("|").split("|")]
        if len(parts) != 3 or not all(re.search(r"\w", p) and len(p) <= MAX_PART_CHARS for p in parts):
            skipped += 1
        elif tuple(p.lower() for p in parts) != _HEADER:
            triples.append((parts[0], parts[1], parts[2]))
    return triples, skipped


def _answer_text(answer: Any) -> str:
    return answer if isinstance(answer, str) else answer.text


def extract_graph(
    store: KnowledgeStore,
    corpus: str,
    graph: str,
    llm: BaseChatModel,
    *,
    batch_size: int = 8,
    limit: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> ExtractReport:
    """Prompt `llm` with each passage of `corpus` (the first `limit`) and add the triples it
    states to `graph`. Passages go to the model `batch_size` at a time (`llm.batch`, concurrent)
    and each batch's triples are committed together. A failed model call is counted, not raised.
    `progress(n)` gets the number of passages done after each batch."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise InvalidInput(f"limit must be a non-negative integer or None, got {limit!r}")
    # Read the passages first: some backends cannot stream a corpus while writing to the store.
    passages: list[Passage] = list(islice(store.passages(corpus), limit))
    report = ExtractReport()
    for start in range(0, len(passages), batch_size):
        chunk = passages[start : start + batch_size]
        prompts = [[HumanMessage(EXTRACT_PROMPT.format(title=p.title, text=p.text))] for p in chunk]
        triples: list[Triple] = []
        for p, answer in zip(chunk, llm.batch(prompts, return_exceptions=True), strict=True):  # type: ignore[arg-type]
            if isinstance(answer, Exception):
                report.failed += 1
                if len(report.errors) < MAX_ERRORS:
                    report.errors.append(f"passage {p.id}: {type(answer).__name__}: {answer}")
                continue
            found, skipped = parse_triples(_answer_text(answer))
            triples += found
            report.lines_skipped += skipped
        report.passages += len(chunk)
        report.triples_seen += len(triples)
        if triples:
            report.triples_added += store.add_triples(graph, triples)
        if progress:
            progress(report.passages)
    return report
