"""Benchmark adapters: BFCL-v4, tau2-bench, VitaBench, FinMCP-Bench -> tasks, real envs, scorers.

Each adapter module imports its optional package lazily, so ``import envace.benchmarks`` and
``envace bench list`` work without any of them installed.
"""

from envace.benchmarks.base import BenchEpisode, BenchItem, BenchScore, Category
from envace.benchmarks.registry import benchmark_names, get_adapter, listing

__all__ = ["BenchEpisode", "BenchItem", "BenchScore", "Category", "benchmark_names", "get_adapter", "listing"]
