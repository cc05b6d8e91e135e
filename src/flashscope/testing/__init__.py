"""Helpers shared by the test suite and the benchmark harness (references, tolerances)."""
