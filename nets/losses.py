"""The training loss of the KataGo paper (Appendix B), term by term, with per-row weights.

Targets (a dict of tensors, B rows, from the training rows):
    policy           (B, T*T + 1)  the search's visit distribution after pruning (sums to 1)
    policy_weight    (B,)          1 for full searches, 0 for the cheap searches of playout
                                   cap randomization: 0 removes both policy terms of the row
    opponent_move    (B,)          index (y * T + x, or T*T for pass) of the opponent's reply;
                                   -1 where there is none (the game's last move)
    outcome          (B, 3)        win, loss, no result for the player to move (one-hot, or
                                   the search's win probability for a side position)
    score            (B,)          final score difference for the player to move (multiple of 0.5)
    ownership        (B, T, T)     +1 the player to move's, -1 the opponent's, 0 neither
    value_weight     (B,)          weight of the value terms (down-weighted rows < 1)
    score_weight     (B,)          optional: 0 where the final score and ownership are not
                                   known (side positions); multiplies those terms

Every term's weight is a key of LossWeights, filled from params.yaml's `loss` section.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as nnf
from torch import nn

from nets.model import score_values


@dataclasses.dataclass(frozen=True)
class LossWeights:
    """Each term's weight. No defaults here: params.yaml's `loss` section is where they live
    (stages.params.LossParams validates it and builds this)."""

    policy: float
    opponent_policy: float
    outcome: float
    ownership: float  # divided by the board's area, summed over its points
    score_pdf: float
    score_cdf: float
    score_mean: float
    score_stdev: float
    l2: float


def _huber(x: torch.Tensor, delta: float) -> torch.Tensor:
    return nnf.huber_loss(x, torch.zeros_like(x), reduction="none", delta=delta)


def loss_terms(
    out: dict[str, torch.Tensor],
    target: dict[str, torch.Tensor],
    mask: torch.Tensor,
    model: nn.Module | None = None,
    *,
    weights: LossWeights,
) -> dict[str, torch.Tensor]:
    """Each weighted loss term averaged over the batch, and their sum as "total". `mask` is the
    board mask (B, T, T) (plane 0 of the inputs)."""
    b = out["policy"].shape[0]
    area = mask.sum(dim=(1, 2))  # (B,)
    policy_weight = target["policy_weight"]
    value_weight = target["value_weight"]
    known = value_weight * target["score_weight"] if "score_weight" in target else value_weight

    log_policy = nnf.log_softmax(out["policy"].float(), dim=1)
    policy = -(target["policy_target"] * log_policy).sum(dim=1) * policy_weight

    reply = target["opponent_move"]
    has_reply = (reply >= 0).float()
    log_reply = nnf.log_softmax(out["opponent_policy"].float(), dim=1)
    picked = log_reply.gather(1, reply.clamp(min=0)[:, None]).squeeze(1)
    opponent_policy = -picked * has_reply * policy_weight

    outcome = -(target["outcome"] * nnf.log_softmax(out["outcome"].float(), dim=1)).sum(dim=1)

    # Ownership: binary cross-entropy of (1 + o) / 2, summed over the board / its area.
    predicted = (out["ownership"].float() + 1.0) / 2.0
    truth = (target["ownership"] + 1.0) / 2.0
    eps = 1e-6
    cross = -(truth * torch.log(predicted + eps) + (1 - truth) * torch.log(1 - predicted + eps))
    # The minimum of the cross-entropy (its value at a perfect prediction) is subtracted, so a
    # perfect prediction of a 0 (shared) point costs nothing either.
    floor = -(truth * torch.log(truth + eps) + (1 - truth) * torch.log(1 - truth + eps))
    ownership = ((cross - floor) * mask).sum(dim=(1, 2)) / area

    values = score_values_like(out["score_belief"])
    log_belief = nnf.log_softmax(out["score_belief"].float(), dim=1)  # (B, S)
    target_bin = (
        torch.round((target["final_score"] - values[0]) * 2.0).long().clamp(0, values.numel() - 1)
    )
    score_pdf = -log_belief.gather(1, target_bin[:, None]).squeeze(1)
    belief = log_belief.exp()
    cdf = belief.cumsum(dim=1)
    target_cdf = torch.arange(values.numel(), device=cdf.device)[None] >= target_bin[:, None]
    score_cdf = ((cdf - target_cdf.float()) ** 2).sum(dim=1)

    # Score mean and stdev: self-prediction of the belief's own mean and stdev (detached).
    with torch.no_grad():
        belief_mean = (belief * values).sum(dim=1)
        belief_stdev = torch.sqrt(((values[None] - belief_mean[:, None]) ** 2 * belief).sum(dim=1))
    score_mean = _huber(out["score_mean"].float() - belief_mean, 10.0)
    score_stdev = _huber(out["score_stdev"].float() - belief_stdev, 10.0)

    w = weights
    terms = {
        "policy": w.policy * policy.sum() / b,
        "opponent_policy": w.opponent_policy * opponent_policy.sum() / b,
        "outcome": w.outcome * (outcome * value_weight).sum() / b,
        "ownership": w.ownership * (ownership * known).sum() / b,
        "score_pdf": w.score_pdf * (score_pdf * known).sum() / b,
        "score_cdf": w.score_cdf * (score_cdf * known).sum() / b,
        "score_mean": w.score_mean * (score_mean * value_weight).sum() / b,
        "score_stdev": w.score_stdev * (score_stdev * value_weight).sum() / b,
    }
    if model is not None and w.l2 > 0:
        terms["l2"] = w.l2 * sum(
            (p.float() ** 2).sum() for name, p in model.named_parameters() if p.dim() > 1
        )
    terms["total"] = sum(terms.values())
    return terms


def score_values_like(belief: torch.Tensor) -> torch.Tensor:
    """The score values of a belief tensor's bins ((S - 1) / 4 = the score range)."""
    r = (belief.shape[1] - 1) // 4
    return torch.arange(-2 * r, 2 * r + 1, device=belief.device, dtype=torch.float32) * 0.5


__all__ = ["LossWeights", "loss_terms", "score_values", "score_values_like"]
