"""The Go core as numba kernels for the CPU and, from the same source, CUDA: rules, features,
search and the batched self-play and match drivers. Never imports torch."""
