"""One base class under every error specdec-jax raises for bad input, files or settings.

    try:
      out = sd.speculative_generate(target, drafter, enc, gamma=0)
    except sd.SpecdecError as e:      # "gamma must be an integer >= 1, got 0"
      print(e)

Each subclass also derives from `ValueError` (what callers caught before the
base class existed). Errors that mean a bug in specdec-jax itself are NOT
SpecdecErrors: they propagate as ordinary exceptions with their traceback.
"""

from __future__ import annotations


class SpecdecError(Exception):
  """Bad input, a bad file or bad settings; the message names the problem."""


class InputWarning(UserWarning):
  """An input that decodes, but likely not as meant (a T5 input without EOS); warned once
  per process. Silence it with `warnings.filterwarnings("ignore", category=sd.InputWarning)`."""


class ConfigError(SpecdecError, ValueError):
  """A model config is unknown or malformed."""


class InputError(SpecdecError, ValueError):
  """A decode input is malformed (shape, dtype, length, vocabulary, method settings)."""


class SamplingError(SpecdecError, ValueError):
  """Invalid sampling parameters."""


class CheckpointError(SpecdecError, ValueError):
  """A checkpoint is missing, corrupt, of an unknown format, or refused (pickle)."""


class TokenizerError(SpecdecError, ValueError):
  """A tokenizer file is missing or unreadable, or its vocabulary does not fit the model."""


class FileAccessError(SpecdecError, ValueError):
  """A file or directory the user named cannot be read or written."""


class PromptError(SpecdecError, ValueError):
  """Prompts that cannot be decoded: none given, not token ids, outside the vocabulary."""
