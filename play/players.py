"""Move choosers the GTP engine plays with: the random player here, the network with the search
in play.netplayer.

A player gets the game and the colour to move and returns a point, None (pass) or RESIGN;
`seconds` is the clock's budget for the move (None: no limit).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from gocore.playout import new_rng
from play.game import Game, Move

RESIGN = "resign"


class Player(Protocol):
    name: str

    def genmove(
        self, game: Game, color: int, *, cleanup: bool = False, seconds: float | None = None
    ) -> Move | str:
        """The move to play; `cleanup` asks not to pass while dead opponent stones remain."""
        ...

    def set_seed(self, seed: int) -> None: ...


class RandomPlayer:
    """Uniform over legal moves that fill none of its own eyes; passes when nothing else is left."""

    name = "random"

    def __init__(self, seed: int | None = None):
        self.set_seed(np.random.SeedSequence().entropy if seed is None else seed)

    def set_seed(self, seed: int) -> None:
        self._rng = new_rng(1, int(seed) % (1 << 63))

    def genmove(
        self, game: Game, color: int, *, cleanup: bool = False, seconds: float | None = None
    ) -> Move | str:
        # The random player never passes while it has a move, so cleanup changes nothing.
        if len(game.moves) >= game.b.max_moves:
            return None
        return game.random_move(color, self._rng)


PLAYERS = {"random": RandomPlayer}


def make_player(name: str, *, seed: int | None = None) -> Player:
    try:
        factory = PLAYERS[name]
    except KeyError:
        raise ValueError(f"unknown player {name!r}; known: {', '.join(sorted(PLAYERS))}") from None
    return factory(seed=seed)
