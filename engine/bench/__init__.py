"""Benchmarks: workloads through mlx-lm and Lanes side by side, the soak, and the store at scale."""
