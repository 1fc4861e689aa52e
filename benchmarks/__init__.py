"""Benchmarks: each module has `run(quick=False) -> list[dict]` and runs alone with `python -m benchmarks.<name>`."""
