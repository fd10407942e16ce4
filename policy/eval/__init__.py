"""Evaluation: the benchmark suite, bench tune and their plots."""
