"""Benchmarks behind ``corral bench NAME --json``: each module exposes ``run(params) -> dict``."""
