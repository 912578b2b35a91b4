"""Fixtures shared by the tests and the benchmarks: random-weight model folders, the float32
references, comparisons. Not part of the product's distribution: importable from the repository
root (tests/conftest.py puts it on sys.path; the benchmarks are run from there)."""
