"""Reproducible benchmarks: `make bench` (python -m bench). Each module measures
against a baseline in the same run and writes bench/results/<name>.csv."""
