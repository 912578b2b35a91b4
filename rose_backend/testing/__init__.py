"""Fixtures shared by the tests and the benchmarks: random-weight model folders, comparisons."""
