"""A map whose entries are kept for a time window, in rotating generations: what the executor remembers of
commands it handled and exits it published, for as long as a redelivery or a waiting move can ask, and the
exits the node registry applied, for as long as a heartbeat lists them."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Recent"]

V = TypeVar("V")


class Recent(Generic[V]):
    """A map that keeps each entry for at least ``window_s`` (by ``clock``) and forgets it within
    ``window_s × generations / (generations − 1)``; at most ``cap`` entries (older ones go first).

    Entries live in generations (plain dicts, newest first) that rotate every ``window_s / (generations − 1)``
    (and early when the newest holds ``cap / generations``): no timestamp per entry, no per-entry eviction, so
    an entry costs its key, its value and a dict slot; the size settles at rate × window within one window,
    whatever the rate. Rotation is lazy (on access), so an idle map keeps its memory until touched again.
    """

    __slots__ = ("_clock", "_generations", "_gens", "_per_gen", "_started", "_step", "cap", "window_s")

    def __init__(self, window_s: float, cap: int, *, clock: Callable[[], float] = time.monotonic,
                 generations: int = 6) -> None:
        if window_s <= 0 or cap < 1 or generations < 2:
            raise ValueError("Recent needs window_s > 0, cap >= 1 and generations >= 2")
        self.window_s, self.cap, self._clock = window_s, cap, clock
        self._generations = generations
        self._step = window_s / (generations - 1)
        self._per_gen = max(1, cap // generations)
        self._gens: deque[dict[str, V]] = deque([{}])
        self._started = clock()  # when the newest generation began

    def _age(self) -> None:
        now = self._clock()
        steps = int((now - self._started) // self._step)
        if steps <= 0:
            return
        if steps >= self._generations:  # everything is older than the window
            self._gens = deque([{}])
        else:
            for _ in range(steps):
                self._rotate()
        self._started += steps * self._step

    def _rotate(self) -> None:
        self._gens.appendleft({})
        while len(self._gens) > self._generations:
            self._gens.pop()

    def get(self, key: str) -> V | None:
        self._age()
        for g in self._gens:
            got = g.get(key)
            if got is not None or key in g:
                return got
        return None

    def __contains__(self, key: str) -> bool:
        self._age()
        return any(key in g for g in self._gens)

    def put(self, key: str, value: V) -> None:
        self._age()
        newest = self._gens[0]
        if len(newest) >= self._per_gen:  # the cap: rotate early (the oldest generation goes sooner)
            self._rotate()
            self._started = self._clock()
            newest = self._gens[0]
        newest[key] = value

    def __len__(self) -> int:
        """Entries held (a key put again in a later generation counts twice until the older one goes)."""
        self._age()
        return sum(len(g) for g in self._gens)
