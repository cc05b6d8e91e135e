"""Benchmark harness: registered attention providers, validation that must pass before a
timing counts, timers, the standard shape suite, and table/JSON/CSV/PNG output.

Entry points: :func:`flashscope.bench.harness.run_bench` and ``flashscope bench``.
"""
