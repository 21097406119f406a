"""The KV states of recent calls, so that a call restores the longest prompt prefix any of them shares.

llama.cpp keeps one KV cache per context, which serves a prompt prefix shared with the previous call only.
Agents alternate roles (Mujica's planner and workers, OPERA's plan, analysis and synthesis) and every
question resends the same system prompts, so much of what a call prefills was prefilled a few calls ago.
`PrefixCache` keeps the state of the last calls' token sequences (llama.cpp's per-sequence state, as its
server's slots save them), least recently used first out, within a byte budget.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixCache:
    """Token sequence -> saved state (a bytearray, which ctypes lends to llama.cpp without a copy), at most
    `capacity` bytes in all; least recently used out first.
    A sequence that is a prefix of a newer one is dropped: the newer one serves every prompt it would."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 0
        self._states: OrderedDict[tuple[int, ...], bytearray] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def longest(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], bytearray, int] | None:
        """(the cached sequence sharing the longest prefix with `tokens`, its state, that prefix's length),
        or None if none shares a token; the one found becomes the most recently used."""
        best, shared = None, 0
        for key in self._states:
            n = common_prefix(key, tokens)
            if n > shared:
                best, shared = key, n
        if best is None:
            return None
        self._states.move_to_end(best)
        return best, self._states[best], shared

    def drop(self, tokens: Sequence[int]) -> None:
        """Forget the state of `tokens` (one that failed to load)."""
        state = self._states.pop(tuple(tokens), None)
        if state is not None:
            self.size -= len(state)

    def put(self, tokens: Sequence[int], state: bytearray) -> None:
        key = tuple(tokens)
        if not key or len(state) > self.capacity:
            return
        newer = next((k for k in self._states if len(k) >= len(key) and k[:len(key)] == key), None)
        if newer is not None:  # a cached sequence holds this one
            self._states.move_to_end(newer)
            return
        for old in [k for k in self._states if len(k) <= len(key) and key[:len(k)] == k]:
            self.size -= len(self._states.pop(old))
        self._states[key] = state
        self.size += len(state)
        while self.size > self.capacity:
            self.size -= len(self._states.popitem(last=False)[1])
