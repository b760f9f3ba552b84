"""Tools over the core library: CLI, benchmarks, comparisons, evaluation, training, demo.

Each tool is built from pieces written once here:

    methods    decode methods as values (Baseline, Speculative) and `decode_corpus`, whose
               statistics are `stats.merge_outputs` over the real rows: the one aggregator
    batching   rows to fixed-size padded batches (+ the count of real rows)
    options    sampling mode (greedy | sample + temperature / top_k / top_p), int lists
    models     model and drafter names (a path, config:NAME, "ngram", "prompt-lookup")
    prompts    prompts from arguments, files, stdin, or random ids
    timing     alternating rounds over several methods, medians
    costs      step costs (c, verify cost) and the theory's predictions from them
    report     JSON-safe values, atomic writes, machine facts
    errors     the tools' errors, every one a `specdec_jax.errors.SpecdecError`
"""

from specdec_jax.tools.errors import (
  BenchError,
  CLIError,
  CompareError,
  DataError,
  EvaluationError,
  FileAccessError,
  MissingDataError,
  OptionError,
  PromptError,
  ResultsError,
  T5XSourceError,
  ToolError,
  TrainingError,
)

__all__ = ["BenchError", "CLIError", "CompareError", "DataError", "EvaluationError",
           "FileAccessError", "MissingDataError", "OptionError", "PromptError", "ResultsError",
           "T5XSourceError", "ToolError", "TrainingError"]
