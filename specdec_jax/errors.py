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

import functools
import inspect
import warnings
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


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


class ToolError(SpecdecError, ValueError):
  """Bad settings or input of a tool: the `specdec` CLI's, or a companion's such as the lab
  (`specdec-jax-lab`), whose errors derive from it."""


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
  """Invalid timing or benchmark settings."""


# Keywords renamed in issue 36 (one name for the model input, T5X's `inputs`): the old
# names still work, with a DeprecationWarning, until a later release removes them.
OLD_NAMES = {"encoder_tokens": "inputs", "drafter_encoder_tokens": "drafter_inputs",
             "small_encoder_tokens": "small_inputs"}


def accepts_old_names(fn: F) -> F:
  """Let `fn` (a function, or a class: its `__init__`) take each keyword of `OLD_NAMES`
  whose new name it has, warning (DeprecationWarning) that the new one replaces it.

  Passing both names, by keyword or the new one by position, is an `InputError`.
  """
  if isinstance(fn, type):
    fn.__init__ = accepts_old_names(fn.__init__)  # type: ignore[misc]
    return fn
  params = list(inspect.signature(fn).parameters)
  owner = fn.__qualname__.removesuffix(".__init__")
  renames = {old: (new, params.index(new)) for old, new in OLD_NAMES.items() if new in params}

  @functools.wraps(fn)
  def call(*args, **kwargs):
    for old, (new, position) in renames.items():
      if old in kwargs:
        if new in kwargs or len(args) > position:
          raise InputError(f"{owner}: got both {new} and {old} (its old name); pass {new} only")
        warnings.warn(f"{owner}: {old}= is deprecated, pass {new}=", DeprecationWarning,
                      stacklevel=2)
        kwargs[new] = kwargs.pop(old)
    return fn(*args, **kwargs)

  return call  # type: ignore[return-value]
