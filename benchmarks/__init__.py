"""jobqueue's benchmark suite: ``python -m benchmarks --help`` (see docs/performance.md)."""
