"""Benchmarks: see BENCHMARKS.md."""
