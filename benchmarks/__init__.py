"""Benchmarks: `python -m benchmarks [--quick] [--only NAME]` runs them all in one process,
each figure beside a baseline measured in the same run; most sections also run alone
as `python -m benchmarks.<name>`."""
