"""The lab's errors: each a `LabError`, so a `specdec_jax.errors.SpecdecError` (and a
`ValueError`): `specdec`'s main reports any of them as one line and exits 1.

A lab module raises the subclass of its concern; OS errors a user can cause become a
`FileAccessError` naming the file (`specdec_jax.errors`), flags that conflict a
`specdec_jax.flags.FlagError`.
"""

from specdec_jax.errors import SpecdecError

__all__ = ["BenchError", "CompareError", "DataError", "EvaluationError", "LabError",
           "MissingDataError", "ResultsError", "SweepError", "T5XSourceError", "TrainingError"]


class LabError(SpecdecError, ValueError):
  """Bad settings or input of a lab command, script or report."""


class BenchError(LabError):
  """Invalid timing or benchmark settings."""


class EvaluationError(LabError):
  """An evaluation request that cannot be served (bad data, sizes)."""


class SweepError(LabError):
  """A sweep's settings or points are invalid."""


class ResultsError(LabError):
  """Bad settings, a missing workdir piece, or a --resume file made with other settings."""


class CompareError(LabError):
  """Invalid comparison settings, or outputs that differ where they must be identical."""


class T5XSourceError(CompareError):
  """The T5X checkout is missing or lacks a file this comparison needs."""


class TrainingError(LabError):
  """Invalid training settings, or a run that cannot continue as asked."""


class DataError(LabError):
  """The dataset cannot be built: an unusable dictionary file, too few pairs for the splits."""


class MissingDataError(DataError, FileNotFoundError):
  """The dictionary file does not exist (also a FileNotFoundError)."""
