"""Every benchmark, each beside a named baseline measured in the same run (docs/benchmarks.md):
the rules engine (rules), the nets (nets), the input encoder (features), self-play and its
threads (selfplay), the window's shuffle (shuffle), self-play on a Dask cluster (scale), and
the engine's seconds per move (play); `tengen bench ...` runs them (bench.cli)."""
