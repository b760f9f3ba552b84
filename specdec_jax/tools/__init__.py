"""Tools over the core library: CLI, benchmarks, comparisons, evaluation, training, demo."""
