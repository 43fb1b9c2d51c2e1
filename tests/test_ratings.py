"""The Bradley-Terry fit against hand values: two players at a known win rate, a transitive
three-player ladder, standard errors, draws, the prior, and what cannot be rated."""

from __future__ import annotations

import math

import pytest

from play.ratings import Pairing, RatingError, UnboundedRating, elo_difference, fit


def test_two_players_at_a_known_win_rate():
    # 75 of 100: the ML difference is 400 log10(3) = 190.85 Elo; its standard error is
    # 1 / sqrt(n p (1 - p)) nats = 1 / sqrt(18.75) * 400 / ln 10 = 40.12 Elo.
    ratings = fit([Pairing("A", "B", 100, 75)], anchor="B", prior_draws=0)
    assert ratings["B"].elo == 0 and ratings["B"].stderr == 0
    assert ratings["A"].elo == pytest.approx(400 * math.log10(3), abs=1e-6)
    assert ratings["A"].stderr == pytest.approx(400 / math.log(10) / math.sqrt(18.75), abs=1e-6)
    # The anchor moves everything by its rating; who is listed first does not matter.
    shifted = fit([Pairing("B", "A", 100, 25)], anchor="B", anchor_elo=1000, prior_draws=0)
    assert shifted["A"].elo == pytest.approx(1000 + 400 * math.log10(3), abs=1e-6)


def test_draws_count_half_and_the_prior_adds_virtual_draws():
    # 10 wins, 10 draws, 0 losses = 15 of 20; one virtual draw makes it 15.5 of 21.
    assert fit([Pairing("A", "B", 20, 15)], anchor="B", prior_draws=0)["A"].elo == pytest.approx(
        elo_difference(15 / 20), abs=1e-6
    )
    assert fit([Pairing("A", "B", 20, 15)], anchor="B", prior_draws=1)["A"].elo == pytest.approx(
        elo_difference(15.5 / 21), abs=1e-6
    )


def test_a_transitive_ladder_of_three():
    """A beats B at 76% (+200), B beats C at 76% (+200), and A beats C at 91% (+400): the
    consistent fit puts them exactly 200 apart."""
    p200 = 1 / (1 + 10 ** (-200 / 400))
    p400 = 1 / (1 + 10 ** (-400 / 400))
    n = 10_000
    ratings = fit(
        [Pairing("A", "B", n, n * p200), Pairing("B", "C", n, n * p200),
         Pairing("A", "C", n, n * p400)],
        anchor="C", prior_draws=0,
    )  # fmt: skip
    assert ratings["B"].elo == pytest.approx(200, abs=1e-3)
    assert ratings["A"].elo == pytest.approx(400, abs=1e-3)
    # Without the A-C games A is rated through B alone, with a larger error.
    chain = fit([Pairing("A", "B", n, n * p200), Pairing("B", "C", n, n * p200)], anchor="C",
                prior_draws=0)  # fmt: skip
    assert chain["A"].elo == pytest.approx(400, abs=1e-3)
    assert chain["A"].stderr > ratings["A"].stderr


def test_what_cannot_be_rated():
    with pytest.raises(UnboundedRating, match="won or lost every game"):
        fit([Pairing("A", "B", 4, 4)], anchor="B", prior_draws=0)
    assert fit([Pairing("A", "B", 4, 4)], anchor="B")["A"].elo == pytest.approx(
        elo_difference(4.5 / 5), abs=1e-6
    )
    with pytest.raises(RatingError, match="no games link"):
        fit([Pairing("A", "B", 4, 2), Pairing("C", "D", 4, 2)], anchor="A")
    with pytest.raises(RatingError, match="has played no game"):
        fit([Pairing("A", "B", 4, 2)], anchor="Z")
    with pytest.raises(ValueError, match="score 5 of 4"):
        Pairing("A", "B", 4, 5)
