"""A slow, obviously-correct Go rules reference in plain Python, to check the numba kernels against.

Positions are frozensets of (x, y, colour); groups and liberties are found by flood fill from
scratch on every move. Nothing here is incremental, so it shares no shortcut with gocore.
"""

from __future__ import annotations

BLACK, WHITE = 1, 2


class ReferenceGame:
    def __init__(self, size: int, *, ko: str, suicide: bool):
        self.size, self.ko, self.suicide = size, ko, suicide
        self.stones: dict[tuple[int, int], int] = {}
        self.to_move = BLACK
        self.captures = {BLACK: 0, WHITE: 0}
        position = self.position()
        self.history: list[frozenset] = [position]  # every position so far
        self.situations: set[tuple[frozenset, int]] = {(position, BLACK)}
        self.before_last: frozenset | None = None  # the position before the last stone move

    def position(self) -> frozenset:
        return frozenset((x, y, c) for (x, y), c in self.stones.items())

    def neighbours(self, p):
        x, y = p
        for q in ((x - 1, y), (x + 1, y), (x, y - 1), (x, y + 1)):
            if 0 <= q[0] < self.size and 0 <= q[1] < self.size:
                yield q

    def group(self, stones, p):
        colour = stones[p]
        seen, stack, libs = {p}, [p], set()
        while stack:
            s = stack.pop()
            for q in self.neighbours(s):
                if q not in stones:
                    libs.add(q)
                elif stones[q] == colour and q not in seen:
                    seen.add(q)
                    stack.append(q)
        return seen, libs

    def result_of(self, colour, p):
        """(new stones, captured count, suicided count) or None if occupied/illegal suicide."""
        if p in self.stones:
            return None
        stones = dict(self.stones)
        stones[p] = colour
        captured = 0
        for q in self.neighbours(p):
            if q in stones and stones[q] == 3 - colour:
                group, libs = self.group(stones, q)
                if not libs:
                    for s in group:
                        del stones[s]
                    captured += len(group)
        group, libs = self.group(stones, p)
        suicided = 0
        if not libs:
            if not self.suicide or len(group) == 1:
                return None
            for s in group:
                del stones[s]
            suicided = len(group)
        return stones, captured, suicided

    def legal(self, colour, p) -> bool:
        if p is None:
            return True
        outcome = self.result_of(colour, p)
        if outcome is None:
            return False
        position = frozenset((x, y, c) for (x, y), c in outcome[0].items())
        if self.before_last is not None and position == self.before_last:
            return False  # the basic ko, under every rule
        if self.ko == "positional":
            return position not in self.history
        if self.ko == "situational":
            return (position, 3 - colour) not in self.situations
        return True

    def play(self, colour, p) -> None:
        assert self.legal(colour, p)
        if p is None:
            self.before_last = None
        else:
            self.before_last = self.position()
            stones, captured, suicided = self.result_of(colour, p)
            self.stones = stones
            self.captures[colour] += captured
            self.captures[3 - colour] += suicided
        self.to_move = 3 - colour
        position = self.position()
        self.history.append(position)
        self.situations.add((position, self.to_move))

    def legal_moves(self, colour) -> set:
        return {
            (x, y) for y in range(self.size) for x in range(self.size) if self.legal(colour, (x, y))
        }
