"""Benchmarks (`make bench…`); never part of `make test`."""
