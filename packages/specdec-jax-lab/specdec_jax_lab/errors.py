"""The lab's errors: each a `specdec_jax.errors.ToolError` (so a `SpecdecError`, and a
`ValueError`): `specdec`'s main reports any of them as one line and exits 1.

A lab module raises the subclass of its concern; OS errors a user can cause become a
`FileAccessError` naming the file (`specdec_jax.errors`).
"""

from specdec_jax.errors import BenchError, ToolError

__all__ = ["BenchError", "CompareError", "DataError", "EvaluationError", "MissingDataError",
           "ResultsError", "SweepError", "T5XSourceError", "ToolError", "TrainingError"]


class EvaluationError(ToolError):
  """An evaluation request that cannot be served (bad data, sizes)."""


class SweepError(ToolError):
  """A sweep's settings or points are invalid."""


class ResultsError(ToolError):
  """Bad settings, a missing workdir piece, or a --resume file made with other settings."""


class CompareError(ToolError):
  """Invalid comparison settings, or outputs that differ where they must be identical."""


class T5XSourceError(CompareError):
  """The T5X checkout is missing or lacks a file this comparison needs."""


class TrainingError(ToolError):
  """Invalid training settings, or a run that cannot continue as asked."""


class DataError(ToolError):
  """The dataset cannot be built: an unusable dictionary file, too few pairs for the splits."""


class MissingDataError(DataError, FileNotFoundError):
  """The dictionary file does not exist (also a FileNotFoundError)."""
