"""Benchmarks: `make bench` runs bench/run_all.py; see docs/benchmarks.md."""
