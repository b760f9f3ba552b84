"""The one exception type of the checkpoints package."""


class CheckpointError(ValueError):
  """A checkpoint cannot be found or read, or does not match its config.

  The message always names the file or directory and the problem.
  """
