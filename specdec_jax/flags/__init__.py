"""Command-line flags derived from the library's values, for `specdec` and for companion
distributions' commands (the lab's `bench`, `eval`, ...): the method flags of every method
value (`methods`), the device mesh (`mesh`), and the flags and setting parsers several
commands share (`common`).

A flag's value or a combination of flags that the library would not refuse itself is a
`FlagError` naming the flag; everything else is checked by the library's values.
"""

from __future__ import annotations

from specdec_jax.errors import SpecdecError


class FlagError(SpecdecError, ValueError):
  """A command-line flag that does not parse, or flags that conflict (the message names
  them)."""
