"""A GTP engine for match tests: tengen's engine, except that at the end it calls every stone
on the board dead, so the two engines never agree and the referee must decide."""

import sys

from gocore.rules import PRESETS
from play.gtp import GtpEngine
from play.players import RandomPlayer


class Liar(GtpEngine):
    def cmd_final_status_list(self, args: list[str]) -> str:
        if args == ["dead"]:
            return " ".join(self._vertices(group) for _, group in self.game.groups())
        return super().cmd_final_status_list(args)


Liar(RandomPlayer(seed=int(sys.argv[1])), rules=PRESETS["chinese"], name="liar").serve()
