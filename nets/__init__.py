"""The networks in torch: KataGo's residual net with global pooling, the MobileNetV2+SE trunk,
their losses, checkpoints (weights only) and the batched evaluator."""
