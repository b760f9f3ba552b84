"""The errors the tools raise: every one is a `specdec_jax.errors.SpecdecError`.

    try:
      cli.main(["decode", "--model", "nowhere", "5 1"])
    except sd.SpecdecError as e:        # never reached: main reports it and returns 1
      ...

A tool raises the subclass of its concern; a caller catches `SpecdecError` (what
`specdec`'s main does) or a subclass. Like the core's, each is also a `ValueError`.
OS errors a user can cause (a missing prompt file, an unwritable output directory)
become a `FileAccessError` where they happen, with a message naming the file.
"""

from specdec_jax.errors import SpecdecError


class ToolError(SpecdecError, ValueError):
  """Bad settings or input of a tool (the base of every class below)."""


class OptionError(ToolError):
  """A setting that does not parse or conflicts with another (sampling mode, overrides,
  integer lists, a drafter name)."""


class FileAccessError(ToolError):
  """A file or directory the user named cannot be read or written."""


class PromptError(ToolError):
  """Prompts that cannot be decoded: none given, not token ids, outside the vocabulary."""


class CLIError(ToolError):
  """A command-line input the library would not catch itself (flag combinations, recipes)."""


class BenchError(ToolError):
  """Invalid benchmark settings."""


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
