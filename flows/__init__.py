"""Prefect flows (the loop, ablations, schedules), the `tengen` command line and the benchmark
programs: the top of the dependency order, imported by nothing else."""
