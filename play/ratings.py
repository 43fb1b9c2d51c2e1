"""Elo ratings from game results: a Bradley-Terry maximum-likelihood fit over every pairing at
once, draws as half a win and half a loss, Elo with standard errors from the observed Fisher
information, anchored so that one named player has a set rating.

P(i beats j) = 1 / (1 + 10^((elo_j - elo_i) / 400)). With `prior_draws` > 0, every pairing
that was played also counts that many virtual draws (BayesElo's prior), so a player who won or
lost every game still gets a finite rating; 0 gives the plain maximum-likelihood fit.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

ELO_PER_NAT = 400.0 / math.log(10.0)


@dataclasses.dataclass(frozen=True)
class Pairing:
    """Games between two players: a's score counts a win as 1 and a draw as 1/2."""

    a: str
    b: str
    games: int
    a_score: float

    def __post_init__(self):
        if self.games < 0 or not 0 <= self.a_score <= self.games:
            raise ValueError(f"{self.a} vs {self.b}: score {self.a_score} of {self.games} games")


@dataclasses.dataclass(frozen=True)
class Rating:
    elo: float
    stderr: float  # 0 for the anchor


class RatingError(ValueError):
    """Results that cannot be rated (no games, players not connected to the anchor)."""


class UnboundedRating(RatingError):
    """A player won or lost every game and no prior draws keep its rating finite."""


def fit(
    pairings: list[Pairing],
    *,
    anchor: str,
    anchor_elo: float = 0.0,
    prior_draws: float = 1.0,
    iterations: int = 100,
) -> dict[str, Rating]:
    """Every player's Elo and standard error; `anchor` is held at `anchor_elo`."""
    played = [p for p in pairings if p.games > 0]
    players = sorted({p.a for p in played} | {p.b for p in played})
    if anchor not in players:
        raise RatingError(f"the anchor {anchor!r} has played no game (players: {players})")
    _check_connected(played, players, anchor)
    index = {name: i for i, name in enumerate(players)}
    k = len(players)
    # Each pairing once per ordered pair: wins[i, j] = i's score against j, games[i, j].
    wins = np.zeros((k, k))
    games = np.zeros((k, k))
    for p in played:
        i, j = index[p.a], index[p.b]
        wins[i, j] += p.a_score + prior_draws / 2
        wins[j, i] += p.games - p.a_score + prior_draws / 2
        games[i, j] += p.games + prior_draws
        games[j, i] += p.games + prior_draws
    scores, totals = wins.sum(axis=1), games.sum(axis=1)
    if perfect := [players[i] for i in range(k) if scores[i] in (0.0, totals[i])]:
        raise UnboundedRating(
            f"{perfect} won or lost every game: no finite rating; use prior_draws > 0"
        )
    free = [i for i in range(k) if players[i] != anchor]
    theta = np.zeros(k)  # natural units (log-odds); the anchor stays at 0

    def log_likelihood(t):
        d = t[:, None] - t[None, :]
        return float((wins * -np.logaddexp(0.0, -d)).sum())

    current = log_likelihood(theta)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(theta[None, :] - theta[:, None]))  # P(i beats j)
        gradient = (wins - games * p).sum(axis=1)
        w = games * p * (1 - p)
        hessian = np.diag(w.sum(axis=1)) - w  # of the negative log-likelihood
        g, h = gradient[free], hessian[np.ix_(free, free)]
        try:
            step = np.linalg.solve(h, g)
        except np.linalg.LinAlgError:
            step = np.linalg.lstsq(h, g, rcond=None)[0]
        scale, improved = 1.0, False
        while scale > 1e-6 and not improved:
            trial = theta.copy()
            trial[free] += scale * step
            value = log_likelihood(trial)
            improved = value >= current - 1e-12
            scale /= 2
        if not improved:
            break
        theta, previous, current = trial, current, value
        if np.abs(2 * scale * step).max() < 1e-10 or abs(current - previous) < 1e-13:
            break
    p = 1.0 / (1.0 + np.exp(theta[None, :] - theta[:, None]))
    w = games * p * (1 - p)
    hessian = (np.diag(w.sum(axis=1)) - w)[np.ix_(free, free)]
    covariance = np.linalg.pinv(hessian)
    stderr = np.zeros(k)
    stderr[free] = np.sqrt(np.maximum(np.diag(covariance), 0.0))
    return {
        name: Rating(
            elo=anchor_elo + ELO_PER_NAT * float(theta[i]), stderr=ELO_PER_NAT * float(stderr[i])
        )
        for name, i in index.items()
    }


def _check_connected(pairings: list[Pairing], players: list[str], anchor: str) -> None:
    neighbours: dict[str, set[str]] = {name: set() for name in players}
    for p in pairings:
        neighbours[p.a].add(p.b)
        neighbours[p.b].add(p.a)
    seen, stack = {anchor}, [anchor]
    while stack:
        for other in neighbours[stack.pop()] - seen:
            seen.add(other)
            stack.append(other)
    if missing := sorted(set(players) - seen):
        raise RatingError(f"no games link {missing} to the anchor {anchor!r}")


def elo_difference(score: float) -> float:
    """The Elo difference that a score (win rate, draws as half) in (0, 1) means."""
    return -400.0 * math.log10(1.0 / score - 1.0)
