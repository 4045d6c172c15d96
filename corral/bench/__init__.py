"""Benchmarks behind ``corral bench NAME --json``: each module exposes ``run(params)``, which
returns a :class:`~corral.bench._common.Document`."""
