"""KataGo's residual net with global pooling (the paper's Appendix A), and the MobileNetV2+SE
trunk (Cazenave 2021) with Polygames-style heads; both give the same outputs.

Inputs: planes (B, 18, T, T) from gocore.features (plane 0 is 1 on the board) and globals
(B, 10). A board smaller than T sits in the top-left corner; every convolution output is
multiplied by the board mask, and batch norms and poolings count only points on the board,
so a 9x9 board gives the same outputs in a 9x9 tensor as in a 19x19 one. When every board of a
batch fills its tensor (a 9x9 run's rows and searches) the masks are all ones: the layers skip
them and the batch norms are torch's own, a third of the elementwise passes.

Outputs (a dict of tensors, B rows):
    policy          (B, T*T + 1)  logits of the move to play; the last is pass; off-board -inf
    opponent_policy (B, T*T + 1)  logits of the opponent's reply
    outcome         (B, 3)        logits of win, loss, no result (for the player to move)
    score_mean      (B,)          final score difference predicted (player to move, points)
    score_stdev     (B,)          its standard deviation (> 0)
    ownership       (B, T, T)     in -1..1: +1 = the player to move's at the end
    score_belief    (B, S)        logits over final score differences, S = 4 R + 1 with R =
                                  nets.config.score_range(config, T)
"""

from __future__ import annotations

import torch
import torch.nn.functional as nnf
from torch import nn

from nets.config import GO_FEATURE_PLANES, MAX_BOARD, NetConfig, score_range

OFF_BOARD_LOGIT = -1e4  # added to policy logits off the board (finite, so fp16 stays sane)


def score_values(config: NetConfig, tensor: int = MAX_BOARD) -> torch.Tensor:
    """The final score differences the score belief's bins stand for at inputs of `tensor` x
    `tensor` points: -R, -R + 0.5, ..., R."""
    r = score_range(config, tensor)
    return torch.arange(-2 * r, 2 * r + 1, dtype=torch.float32) * 0.5


class MaskedBatchNorm(nn.BatchNorm2d):
    """Batch norm whose statistics count only points on the board; the output is 0 off it."""

    def forward(self, x: torch.Tensor, board: Board) -> torch.Tensor:
        # x (B, C, H, W); board.mask (B, 1, H, W), board.count: on-board points in the batch.
        if board.full:  # the same statistics and running averages, in one fused kernel
            if self.training:
                self.num_batches_tracked += 1
            return nnf.batch_norm(
                x,
                self.running_mean,
                self.running_var,
                self.weight,
                self.bias,
                self.training,
                self.momentum,
                self.eps,
            )
        mask, count = board.mask, board.count
        if self.training:
            mean = (x * mask).sum(dim=(0, 2, 3)) / count  # (C,)
            var = (((x - mean[None, :, None, None]) * mask) ** 2).sum(dim=(0, 2, 3)) / count
            with torch.no_grad():
                n = float(count)
                unbiased = var * n / max(n - 1.0, 1.0)
                self.running_mean.lerp_(mean, self.momentum)
                self.running_var.lerp_(unbiased, self.momentum)
                self.num_batches_tracked += 1
        else:
            mean, var = self.running_mean, self.running_var
        scale = self.weight * torch.rsqrt(var + self.eps)
        shift = self.bias - mean * scale
        return (x * scale[None, :, None, None] + shift[None, :, None, None]) * mask


class Board:
    """What every layer needs about the boards of a batch (computed once per forward)."""

    def __init__(self, planes: torch.Tensor):
        self.mask = planes[:, :1]  # (B, 1, H, W)
        self.area = self.mask.sum(dim=(2, 3))  # (B, 1)
        self.count = self.mask.sum()  # scalar: on-board points in the batch
        self.width = torch.sqrt(self.area)  # (B, 1)
        # Every board fills the tensor. Never in a trace (an export: it would be a constant) or
        # under torch.compile (reading it would break the graph and wait for the device): there
        # the masks apply everywhere, fused into the elementwise kernels, and where every point
        # is on the outputs are the same up to float rounding.
        self.full = (
            not torch.jit.is_tracing()
            and not torch.compiler.is_compiling()
            and bool(self.count == self.mask.numel())
        )

    def on(self, x: torch.Tensor) -> torch.Tensor:
        """x with every point off the board set to 0."""
        return x if self.full else x * self.mask

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """KataGo's global pooling: (B, C, H, W) -> (B, 3C) of mean, mean * (width - 14) / 10,
        and max over the board."""
        mean = x.sum(dim=(2, 3)) / self.area
        scaled = mean * (self.width - 14.0) / 10.0
        top = (x if self.full else x + (self.mask - 1.0) * 1e4).amax(dim=(2, 3))
        return torch.cat([mean, scaled, top], dim=1)

    def pool_value(self, x: torch.Tensor) -> torch.Tensor:
        """The value head's pooling: mean, mean * (width - 14) / 10 and
        mean * ((width - 14)^2 / 100 - 0.1)."""
        mean = x.sum(dim=(2, 3)) / self.area
        scaled = mean * (self.width - 14.0) / 10.0
        quadratic = mean * ((self.width - 14.0) ** 2 / 100.0 - 0.1)
        return torch.cat([mean, scaled, quadratic], dim=1)


class NormActConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int):
        super().__init__()
        self.norm = MaskedBatchNorm(c_in)
        self.conv = nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2, bias=False)

    def forward(self, x: torch.Tensor, board: Board) -> torch.Tensor:
        return board.on(self.conv(nnf.relu(self.norm(x, board))))


class ResBlock(nn.Module):
    """Pre-activation residual block: (BN, ReLU, 3x3 conv) twice, added to the input."""

    def __init__(self, c: int):
        super().__init__()
        self.first = NormActConv(c, c, 3)
        self.second = NormActConv(c, c, 3)

    def forward(self, x: torch.Tensor, board: Board) -> torch.Tensor:
        return x + self.second(self.first(x, board), board)


class GlobalPoolBlock(nn.Module):
    """A residual block whose first convolution feeds c_pool channels to global pooling; the
    pooled values become a bias on the other c - c_pool channels."""

    def __init__(self, c: int, c_pool: int):
        super().__init__()
        self.norm = MaskedBatchNorm(c)
        self.conv_regular = nn.Conv2d(c, c - c_pool, 3, padding=1, bias=False)
        self.conv_pooled = nn.Conv2d(c, c_pool, 3, padding=1, bias=False)
        self.norm_pooled = MaskedBatchNorm(c_pool)
        self.pool_bias = nn.Linear(3 * c_pool, c - c_pool, bias=False)
        self.second = NormActConv(c - c_pool, c, 3)

    def forward(self, x: torch.Tensor, board: Board) -> torch.Tensor:
        y = nnf.relu(self.norm(x, board))
        regular = board.on(self.conv_regular(y))  # (B, c - c_pool, H, W)
        pooled = board.on(self.conv_pooled(y))  # (B, c_pool, H, W)
        pooled = nnf.relu(self.norm_pooled(pooled, board))
        regular = regular + board.on(self.pool_bias(board.pool(pooled))[:, :, None, None])
        return x + self.second(regular, board)


class InvertedResidual(nn.Module):
    """MobileNetV2 block with squeeze-and-excitation: 1x1 expansion, 3x3 depthwise, SE, 1x1
    projection, added to the input."""

    def __init__(self, c: int, expansion: int, se_ratio: int):
        super().__init__()
        hidden = c * expansion
        self.expand = nn.Conv2d(c, hidden, 1, bias=False)
        self.norm_expand = MaskedBatchNorm(hidden)
        self.depthwise = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.norm_depthwise = MaskedBatchNorm(hidden)
        self.squeeze = nn.Linear(hidden, max(hidden // se_ratio, 8))
        self.excite = nn.Linear(max(hidden // se_ratio, 8), hidden)
        self.project = nn.Conv2d(hidden, c, 1, bias=False)
        self.norm_project = MaskedBatchNorm(c)

    def forward(self, x: torch.Tensor, board: Board) -> torch.Tensor:
        y = nnf.relu6(self.norm_expand(board.on(self.expand(x)), board))
        y = nnf.relu6(self.norm_depthwise(board.on(self.depthwise(y)), board))
        gate = torch.sigmoid(self.excite(nnf.relu(self.squeeze(y.sum(dim=(2, 3)) / board.area))))
        y = y * gate[:, :, None, None]
        return x + self.norm_project(board.on(self.project(y)), board)


class ScoreBelief(nn.Module):
    """The paper's score belief: for each possible final score s, a small MLP of the pooled
    value features and of s itself (0.05 s and the parity of s) gives a logit; the logits are
    then scaled by a learned positive factor. Returns (B, S) logits, S = 4 R + 1 for the input
    tensor's R (a 9x9 tensor has a third of a 19x19 one's bins: the same logits for the scores
    it can have)."""

    def __init__(self, features: int, hidden: int, config: NetConfig):
        super().__init__()
        self.config = config
        self.register_buffer("values", score_values(config), persistent=False)  # (S,) widest
        self.from_features = nn.Linear(features, hidden)
        self.from_score = nn.Linear(2, hidden, bias=False)
        self.out = nn.Linear(hidden, 1)
        self.scale = nn.Linear(features, 1)

    def forward(self, pooled: torch.Tensor, tensor: int) -> torch.Tensor:
        widest = (self.values.numel() - 1) // 4
        cut = 2 * (widest - score_range(self.config, tensor))
        s = self.values[cut : self.values.numel() - cut]
        parity = torch.remainder(s, 2.0).sub(1.0).abs()  # 1 at even scores, 0 at odd, .5 between
        score_features = torch.stack([0.05 * s, parity], dim=1)  # (S, 2)
        hidden = self.from_features(pooled)[:, None, :] + self.from_score(score_features)[None]
        logits = self.out(nnf.relu(hidden)).squeeze(-1)  # (B, S)
        return logits * nnf.softplus(self.scale(pooled))


class PolicyHead(nn.Module):
    """KataGo's policy head: P and G branches; G pooled into a bias on P; two maps (own move,
    opponent's reply) and two pass logits from the pooled G."""

    def __init__(self, c: int, c_head: int):
        super().__init__()
        self.conv_p = nn.Conv2d(c, c_head, 1, bias=False)
        self.conv_g = nn.Conv2d(c, c_head, 1, bias=False)
        self.norm_g = MaskedBatchNorm(c_head)
        self.g_bias = nn.Linear(3 * c_head, c_head, bias=False)
        self.norm_p = MaskedBatchNorm(c_head)
        self.conv_out = nn.Conv2d(c_head, 2, 1, bias=False)
        self.pass_out = nn.Linear(3 * c_head, 2, bias=False)

    def forward(self, x: torch.Tensor, board: Board) -> tuple[torch.Tensor, torch.Tensor]:
        p = board.on(self.conv_p(x))  # (B, c_head, H, W)
        g = nnf.relu(self.norm_g(board.on(self.conv_g(x)), board))
        pooled = board.pool(g)  # (B, 3 c_head)
        p = p + board.on(self.g_bias(pooled)[:, :, None, None])
        maps = self.conv_out(nnf.relu(self.norm_p(p, board)))  # (B, 2, H, W)
        if not board.full:
            maps = maps + (1.0 - board.mask) * OFF_BOARD_LOGIT
        return maps.flatten(2), self.pass_out(pooled)  # (B, 2, H*W), (B, 2)


class ValueHead(nn.Module):
    """Outcome, score mean and stdev, ownership and the score belief."""

    def __init__(self, c: int, config: NetConfig):
        super().__init__()
        c_val, hidden = config.value_channels, config.value_hidden
        self.conv = nn.Conv2d(c, c_val, 1, bias=False)
        self.norm = MaskedBatchNorm(c_val)
        self.hidden = nn.Linear(3 * c_val, hidden)
        self.outcome = nn.Linear(hidden, 3)
        self.score = nn.Linear(hidden, 2)  # mean, pre-softplus stdev
        self.ownership = nn.Conv2d(c_val, 1, 1)
        self.score_belief = ScoreBelief(3 * c_val, hidden, config)

    def forward(
        self, x: torch.Tensor, board: Board, belief: bool = True
    ) -> dict[str, torch.Tensor]:
        v = nnf.relu(self.norm(board.on(self.conv(x)), board))  # (B, c_val, H, W)
        pooled = board.pool_value(v)  # (B, 3 c_val)
        h = nnf.relu(self.hidden(pooled))
        score = self.score(h)
        out = {
            "outcome": self.outcome(h),
            "score_mean": score[:, 0] * 20.0,  # scores are tens of points: a better-scaled output
            "score_stdev": nnf.softplus(score[:, 1]) * 20.0,
            "ownership": torch.tanh(self.ownership(v)).squeeze(1) * board.mask[:, 0],
        }
        if belief:
            out["score_belief"] = self.score_belief(pooled, x.shape[-1])
        return out


class ConvPolicyHead(nn.Module):
    """Polygames' fully convolutional policy head: a 1x1 convolution of the trunk to the two
    move maps; the two pass logits from the trunk's average."""

    def __init__(self, c: int):
        super().__init__()
        self.conv_out = nn.Conv2d(c, 2, 1)
        self.pass_out = nn.Linear(c, 2)

    def forward(self, x: torch.Tensor, board: Board) -> tuple[torch.Tensor, torch.Tensor]:
        maps = self.conv_out(x)  # (B, 2, H, W)
        if not board.full:
            maps = maps + (1.0 - board.mask) * OFF_BOARD_LOGIT
        mean = x.sum(dim=(2, 3)) / board.area  # (B, c)
        return maps.flatten(2), self.pass_out(mean)


class AveragePoolValueHead(nn.Module):
    """Polygames' value head: global average pooling of the trunk, a hidden layer, then the
    outcome, score and score belief; ownership by a 1x1 convolution."""

    def __init__(self, c: int, config: NetConfig):
        super().__init__()
        hidden = config.value_hidden
        self.hidden = nn.Linear(c, hidden)
        self.outcome = nn.Linear(hidden, 3)
        self.score = nn.Linear(hidden, 2)
        self.ownership = nn.Conv2d(c, 1, 1)
        self.score_belief = ScoreBelief(c, hidden, config)

    def forward(
        self, x: torch.Tensor, board: Board, belief: bool = True
    ) -> dict[str, torch.Tensor]:
        mean = x.sum(dim=(2, 3)) / board.area  # (B, c)
        h = nnf.relu(self.hidden(mean))
        score = self.score(h)
        out = {
            "outcome": self.outcome(h),
            "score_mean": score[:, 0] * 20.0,
            "score_stdev": nnf.softplus(score[:, 1]) * 20.0,
            "ownership": torch.tanh(self.ownership(x)).squeeze(1) * board.mask[:, 0],
        }
        if belief:
            out["score_belief"] = self.score_belief(mean, x.shape[-1])
        return out


class GoNet(nn.Module):
    """The whole network for one NetConfig (resnet or mobile)."""

    def __init__(self, config: NetConfig):
        super().__init__()
        self.config = config
        c = config.channels
        mask = None
        if not config.go_features:  # the input planes it sees (the paper's ablation)
            mask = torch.ones(1, config.planes, 1, 1)
            mask[:, list(GO_FEATURE_PLANES)] = 0.0
        self.register_buffer("input_mask", mask, persistent=False)
        self.stem = nn.Conv2d(config.planes, c, 5, padding=2, bias=False)
        self.global_bias = nn.Linear(config.globals, c, bias=False)
        blocks: list[nn.Module] = []
        for i in range(config.blocks):
            if config.kind == "mobile":
                blocks.append(InvertedResidual(c, config.expansion, config.se_ratio))
            elif i in config.pool_blocks:
                blocks.append(GlobalPoolBlock(c, config.pool_channels))
            else:
                blocks.append(ResBlock(c))
        self.blocks = nn.ModuleList(blocks)
        self.trunk_norm = MaskedBatchNorm(c)
        if config.kind == "mobile":
            self.policy = ConvPolicyHead(c)
            self.value = AveragePoolValueHead(c, config)
        else:
            self.policy = PolicyHead(c, config.policy_channels)
            self.value = ValueHead(c, config)

    def forward(
        self, planes: torch.Tensor, glob: torch.Tensor, *, score_belief: bool = True
    ) -> dict[str, torch.Tensor]:
        """The outputs above; without `score_belief` (the search never reads it, and at a
        self-play batch it is half of b4c32's time) that one is left out."""
        board = Board(planes)
        if self.input_mask is not None:
            planes = planes * self.input_mask
        x = board.on(self.stem(planes))  # (B, c, H, W)
        x = x + board.on(self.global_bias(glob)[:, :, None, None])
        for block in self.blocks:
            x = block(x, board)
        x = nnf.relu(self.trunk_norm(x, board))
        maps, passes = self.policy(x, board)
        out = self.value(x, board, score_belief)
        out["policy"] = torch.cat([maps[:, 0], passes[:, :1]], dim=1)  # (B, H*W + 1)
        out["opponent_policy"] = torch.cat([maps[:, 1], passes[:, 1:]], dim=1)
        return out


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
