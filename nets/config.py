"""Network configurations: one table of sizes, KataGo's residual nets and the MobileNetV2+SE trunk.

The residual sizes follow the KataGo paper (Wu 2019, Appendix A) and the model configs of
KataGo's training code of that time: c_pool channels of a global-pooling block are pooled
(mean, mean scaled by board width, max) into a bias for the other c - c_pool channels; those
blocks sit at regular intervals; the heads' widths grow with the trunk. The small sizes are for
CPU runs and tests. `mobile-*` sizes use Cazenave's MobileNetV2 blocks with squeeze-and-
excitation and Polygames' heads instead of the residual trunk, with the same outputs and losses.
"""

from __future__ import annotations

import dataclasses

N_PLANES = 18  # gocore.features.N_PLANES (nets does not import gocore)
N_GLOBALS = 10
# The Go-specific input planes (gocore.features' LIBERTIES_1..3, LADDERED..LADDER_CATCH,
# OWN_PASS_ALIVE, OPPONENT_PASS_ALIVE): what the paper's "no Go-specific features" ablation takes
# away, leaving the board, the stones, ko, the move history and the rules.
GO_FEATURE_PLANES = (3, 4, 5, 12, 13, 14, 15, 16, 17)
MAX_BOARD = 19
# The score belief covers final score differences from -R to +R points in half-point steps, R =
# the points of the input tensor + SCORE_MARGIN (every score of a board that fits, with room for
# komi and captures under territory rules; KataGo sizes it by its pos_len the same way), at most
# SCORE_RANGE (a 19x19 tensor). Its weights do not depend on R: one net serves every tensor.
SCORE_MARGIN = 40
SCORE_RANGE = MAX_BOARD * MAX_BOARD + SCORE_MARGIN


@dataclasses.dataclass(frozen=True)
class NetConfig:
    name: str
    kind: str  # "resnet" (KataGo) or "mobile" (MobileNetV2 + squeeze-and-excitation)
    blocks: int
    channels: int  # c: trunk width
    pool_blocks: tuple[int, ...] = ()  # resnet: indices of the global-pooling blocks
    pool_channels: int = 0  # c_pool: channels pooled in those blocks
    policy_channels: int = 32  # c_head: the policy head's P and G branches
    value_channels: int = 32  # c_val: the value head's 1x1 convolution
    value_hidden: int = 48  # c_valfc: the value head's fully connected layer
    expansion: int = 6  # mobile: 1x1 expansion factor of an inverted residual block
    se_ratio: int = 4  # mobile: squeeze-and-excitation reduction
    planes: int = N_PLANES
    globals: int = N_GLOBALS
    score_range: int = SCORE_RANGE
    go_features: bool = True  # False: the GO_FEATURE_PLANES are zeroed at the input

    def __post_init__(self):
        if self.kind not in ("resnet", "mobile"):
            raise ValueError(f"net {self.name}: kind must be resnet or mobile (got {self.kind})")
        if any(not 0 <= i < self.blocks for i in self.pool_blocks):
            raise ValueError(f"net {self.name}: pooling blocks {self.pool_blocks} out of range")
        if self.pool_blocks and not 0 < self.pool_channels < self.channels:
            raise ValueError(f"net {self.name}: pool_channels must be in 1..channels-1")

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["pool_blocks"] = list(self.pool_blocks)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> NetConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise ValueError(f"unknown net config keys: {sorted(unknown)}")
        d = dict(d)
        d["pool_blocks"] = tuple(d.get("pool_blocks", ()))
        return cls(**d)


def score_range(config: NetConfig, tensor: int) -> int:
    """R of the score belief for inputs of `tensor` x `tensor` points."""
    return min(config.score_range, tensor * tensor + SCORE_MARGIN)


def _resnet(blocks, channels, pool_blocks, pool, head, val, valfc) -> NetConfig:
    return NetConfig(
        name=f"b{blocks}c{channels}",
        kind="resnet",
        blocks=blocks,
        channels=channels,
        pool_blocks=pool_blocks,
        pool_channels=pool,
        policy_channels=head,
        value_channels=val,
        value_hidden=valfc,
    )


def _mobile(blocks, channels, valfc) -> NetConfig:
    # Polygames' heads have no head channels of their own: policy_channels and value_channels
    # are unused (0).
    return NetConfig(
        name=f"mobile-b{blocks}c{channels}",
        kind="mobile",
        blocks=blocks,
        channels=channels,
        policy_channels=0,
        value_channels=0,
        value_hidden=valfc,
    )


SIZES: dict[str, NetConfig] = {
    c.name: c
    for c in [
        # Small nets for CPU runs and tests.
        _resnet(2, 16, (1,), 8, 8, 8, 16),
        _resnet(4, 32, (1, 3), 16, 16, 16, 32),
        _resnet(6, 64, (2, 4), 16, 16, 16, 32),
        # The paper's sizes.
        _resnet(6, 96, (2, 4), 32, 32, 32, 48),
        _resnet(10, 128, (2, 5, 8), 32, 32, 32, 64),
        _resnet(15, 192, (3, 7, 11), 64, 32, 32, 80),
        _resnet(20, 256, (4, 9, 14), 64, 48, 48, 96),
        # Cazenave's MobileNetV2 + squeeze-and-excitation trunk.
        _mobile(4, 32, 32),
        _mobile(8, 64, 48),
        _mobile(16, 96, 64),
    ]
}


def net_config(name: str, *, global_pooling: bool = True, go_features: bool = True) -> NetConfig:
    """The net of that size; `global_pooling=False` makes every trunk block a plain residual
    block (the heads still pool: the value head cannot do without), `go_features=False` has it
    see only the board, stones, ko, move history and rules (the KataGo paper's ablations)."""
    try:
        config = SIZES[name]
    except KeyError:
        raise ValueError(f"unknown net {name!r}; known: {', '.join(SIZES)}") from None
    if not global_pooling:
        config = dataclasses.replace(config, pool_blocks=(), pool_channels=0)
    if not go_features:
        config = dataclasses.replace(config, go_features=False)
    return config
