"""Plain data types shared by every store backend."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

Triple = tuple[str, str, str]
SearchMode = Literal["bm25", "dense", "hybrid"]
SEARCH_MODES: tuple[str, ...] = ("bm25", "dense", "hybrid")


@dataclass(frozen=True)
class Passage:
    """A passage of a corpus. `id` is unique within its corpus."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class PassageHit:
    id: str
    title: str
    text: str
    score: float


@dataclass(frozen=True)
class EntityHit:
    name: str
    score: float


@dataclass(frozen=True)
class Fact:
    """One edge seen from a node: `out` means node -relation-> other, `in` means other -relation-> node."""

    relation: str
    other: str
    direction: Literal["out", "in"]

    def as_text(self, node: str) -> str:
        if self.direction == "out":
            return f"({node}) -[{self.relation}]-> ({self.other})"
        return f"({self.other}) -[{self.relation}]-> ({node})"


_FACT_LINE = re.compile(r"^\((.+)\) -\[(.+?)\]-> \((.+)\)$")  # a line of Fact.as_text


def fact_ends(text: str) -> list[str]:
    """The subjects and objects of the fact lines in `text` (`Fact.as_text`, one per line, a leading "- " allowed),
    in order of first appearance; other lines are skipped."""
    ends: dict[str, None] = {}
    for line in text.splitlines():
        if match := _FACT_LINE.match(line.strip().removeprefix("- ")):
            ends.update({match.group(1): None, match.group(3): None})
    return list(ends)


@dataclass(frozen=True)
class NodeInfo:
    graph: str
    name: str
    facts: list[Fact] = field(default_factory=list)

    def as_text(self) -> str:
        """The node and its edges, one per line, as agent tools show them."""
        lines = [f"Entity: {self.name}"] + [f"- {f.as_text(self.name)}" for f in self.facts]
        return "\n".join(lines)


@dataclass(frozen=True)
class StoreStats:
    backend: str
    graphs: dict[str, dict[str, int]]  # name -> {"entities": n, "triples": n}
    corpora: dict[str, dict[str, int]]  # name -> {"passages": n}
