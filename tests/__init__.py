"""The test suite (pytest): unit, property, differential, CUDA-simulator and end-to-end."""
