"""The token-level drafter protocol (`Drafter`) and the checks a drafter or proposer passes
before any tracing.

A drafter proposes one token at a time from logits; `loop.DraftLoop` turns it into the
round engine's proposer (`rounds.phases.Proposer`), drafting up to gamma tokens per round.
Both pass through `jax.jit` as arguments, so both must be JAX pytrees: arrays and models as
fields, settings static. The checks below name the missing piece of a near miss (a plain
class, a missing method, another vocabulary) instead of leaving it to a JAX error at trace
time. Writing one: docs/extending/drafter.md.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.errors import InputError

Array = jax.Array

DRAFTER_MEMBERS = ("vocab_size", "init", "first", "next")
PROPOSER_MEMBERS = ("vocab_size", "init", "propose", "update")
_CALLS = {"init": ("inputs", "capacity"), "first": ("state", "seq", "n"),
          "next": ("state", "token"), "propose": ("state", "ctx", "key"),
          "update": ("state", "outcome")}
_DRAFTER_HELP = ("a drafter (sd.Drafter) needs vocab_size, init(inputs, capacity, "
                 "lengths=None), first(state, seq, n) and next(state, token); "
                 "see docs/extending/drafter.md")
_PROPOSER_HELP = ("a proposer (sd.Proposer) needs vocab_size, init(inputs, capacity, "
                  "lengths=None), propose(state, ctx, key) and update(state, outcome)")


@runtime_checkable
class Drafter(Protocol):
  """A token-level drafter: proposes the next token's logits, one token at a time.

  A drafter is a JAX pytree (decorate it with `@flax.struct.dataclass`): arrays and models
  are fields (traced), settings are `struct.field(pytree_node=False)` (static). Its state is
  any pytree of fixed shapes (a cache, the last token, nothing). B rows, V = `vocab_size`,
  T = max_new_tokens; `seq` int32 [B, T + 1] is the round's token buffer: `seq[:, 0]` the
  start token (a decoder-only prompt's last token), `seq[:, 1:n+1]` the n tokens emitted.

      state = drafter.init(inputs [B, Le], capacity)          # T5 target
      state = drafter.init(prompts [B, P], capacity, lengths=[B])     # decoder-only target
      logits [B, V], state = drafter.first(state, seq [B, T+1], n [B])
      logits [B, V], state = drafter.next(state, token [B])

  `first` starts every round from the emitted prefix: its logits are those of the token
  after `seq[b, n[b]]`. A round's rollback is implicit (the next `first` sees the new n),
  so the state never needs undoing. `next` appends the round's own draft `token` and returns
  the logits after it. All three are pure and traced (no Python branching on values).

  The drafter's tokens are drawn from its logits with the run's sampling transform, the
  same one applied to the target, so exactness never depends on the drafter: a bad drafter
  only makes decoding slower.

  Optional attributes: `kind` (a short label the statistics report; "custom" if absent)
  and `shares_target_cache = True` for a drafter that writes into the target's own cache
  (an early exit: its state is then the target's cache).

  Satisfied by `sd.ModelDrafter`, `sd.NGramDrafter`, `sd.PromptLookupDrafter` and
  `sd.early_exit(...)`: `isinstance(d, sd.Drafter)` checks the members are there (not
  their signatures or that the value is a pytree; `check_drafter` does).
  """

  @property
  def vocab_size(self) -> int:
    """V, the vocabulary it drafts from: the target's (checked)."""

  def init(self, inputs: Array, capacity: int, lengths: Array | None = None) -> Any:
    """State before the first round; `capacity` positions suffice for every emitted token
    and a round of drafts (a cache's size)."""

  def first(self, state: Any, seq: Array, n: Array) -> tuple[Array, Any]:
    """(logits float [B, V] after seq[b, n[b]], state) at the start of a round."""

  def next(self, state: Any, token: Array) -> tuple[Array, Any]:
    """(logits float [B, V] after `token` int32 [B], state): one more draft."""


def kind(value: Any) -> str:
  """The drafter's or proposer's label for reports ("custom" when it gives none)."""
  return str(getattr(value, "kind", "custom"))


def check_pytree(value: Any, what: str) -> None:
  """Refuse what `jax.jit` cannot take as an argument: a value that is no pytree (a plain
  class) or a pytree with a leaf that is not an array or a number (a string setting, say)."""
  name = type(value).__name__
  leaves = jax.tree_util.tree_flatten_with_path(value)[0]
  if len(leaves) == 1 and not leaves[0][0] and leaves[0][1] is value and not _array(value):
    raise InputError(f"the {what} {name} is not a JAX pytree: decorate it with "
                     "@flax.struct.dataclass (arrays and models as fields, settings as "
                     "struct.field(pytree_node=False)) so it can pass through jax.jit")
  for path, leaf in leaves:
    if not _array(leaf):
      raise InputError(f"the {what} {name} has a leaf {jax.tree_util.keystr(path)} of type "
                       f"{type(leaf).__name__}, which jax.jit cannot take: make it an array, "
                       "or a static setting with struct.field(pytree_node=False) (a plain "
                       "class inside must be a @flax.struct.dataclass too)")


def _array(leaf: Any) -> bool:
  return isinstance(leaf, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)) \
      or hasattr(leaf, "__jax_array__")


def missing(value: Any, members: tuple[str, ...]) -> list[str]:
  """The members of `members` that `value` lacks (or has but cannot call, for methods)."""
  gone = []
  for member in members:
    if member == "vocab_size":
      if not hasattr(value, member):
        gone.append(member)
    elif not callable(getattr(value, member, None)):
      gone.append(member)
  return gone


def check_members(value: Any, members: tuple[str, ...], what: str, help_text: str,
                  decoder_only: bool = False) -> None:
  """Every member there and callable with the engine's arguments; vocab_size an int."""
  name = type(value).__name__
  gone = missing(value, members)
  if gone:
    listed = ", ".join(f"`{m}`" for m in gone)
    raise InputError(f"not a {what}: {name} has no {listed}; {help_text}")
  vocab = value.vocab_size
  if not isinstance(vocab, (int, np.integer)) or isinstance(vocab, bool) or vocab < 1:
    raise InputError(f"{name}.vocab_size must be an integer >= 1 (the vocabulary it proposes "
                     f"from), got {vocab!r}")
  if _traced_vocab_size(value):
    raise InputError(f"{name}.vocab_size is a pytree leaf, so jax.jit traces it and it has no "
                     "value where shapes are built: declare it static, `vocab_size: int = "
                     "struct.field(pytree_node=False)`")
  for member in members[1:]:
    args = _CALLS[member]
    kwargs = {"lengths": None} if member == "init" and decoder_only else {}
    _check_call(value, member, args, kwargs, what)


class _Leaf:
  """A stand-in for a pytree leaf (`_traced_vocab_size`)."""


def _traced_vocab_size(value: Any) -> bool:
  """Whether `value.vocab_size` is one of its pytree leaves: under jax.jit it would be a
  tracer, and a vocabulary size must be a Python int where shapes are built."""
  leaves, treedef = jax.tree_util.tree_flatten(value)
  if not leaves:
    return False
  try:
    rebuilt = jax.tree_util.tree_unflatten(treedef, [_Leaf() for _ in leaves])
    return isinstance(rebuilt.vocab_size, _Leaf)
  except Exception:   # a property that computes it from leaves, or a strict constructor
    return False


def _check_call(value: Any, member: str, args: tuple[str, ...], kwargs: dict,
                what: str) -> None:
  try:
    signature = inspect.signature(getattr(value, member))
  except (TypeError, ValueError):     # a builtin or a C callable: nothing to read
    return
  try:
    signature.bind(*args, **kwargs)
  except TypeError as e:
    call = ", ".join([*args, *(f"{k}={v}" for k, v in kwargs.items())])
    raise InputError(f"the {what} {type(value).__name__}.{member} cannot be called as "
                     f"{member}({call}): {e}") from None


def check_step(drafter: Any, member: str, out: Any, batch: int, logits_like: Any = None,
               state_like: Any = None, state_of: str = "") -> None:
  """At trace time, what `first` or `next` returned: a pair (logits [B, V] floating,
  state), its logits like `logits_like` and its state like `state_like` (what `state_of`
  returned) in structure, shapes and dtypes, where given: states and logits are loop
  carries (the drafting loop's, the rounds')."""
  name, vocab = type(drafter).__name__, drafter.vocab_size
  if not isinstance(out, tuple) or len(out) != 2:
    raise InputError(f"the drafter {name}.{member} must return a pair (logits [B, V], "
                     f"state), got {type(out).__name__}")
  shape, dtype = getattr(out[0], "shape", None), getattr(out[0], "dtype", None)
  if shape != (batch, vocab) or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
    raise InputError(f"the drafter {name}.{member} returned logits of shape {shape} and "
                     f"dtype {dtype}; a drafter's logits are floating [B, V] = "
                     f"[{batch}, {vocab}]")
  for part, now, then, of in (("logits", out[0], logits_like, "first"),
                              ("state", out[1], state_like, state_of)):
    if then is not None and _spec(now) != _spec(then):
      raise InputError(f"the drafter {name}.{member} returned a {part} unlike {of}'s "
                       f"(structure, shapes or dtypes differ: {_spec(now)} vs "
                       f"{_spec(then)}): it is a loop carry, of fixed shapes")


def _spec(tree: Any) -> tuple[str, list]:
  """A pytree's structure and its leaves' (shape, dtype)."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return str(treedef), [(np.shape(x), str(jnp.result_type(x))) for x in leaves]


def check_drafter(drafter: Any, decoder_only: bool = False) -> None:
  """A token-level drafter's members, their arities, and that it is a pytree."""
  check_members(drafter, DRAFTER_MEMBERS, "drafter", _DRAFTER_HELP, decoder_only)
  check_pytree(drafter, "drafter")


def check_proposer(proposer: Any, decoder_only: bool = False) -> None:
  """A proposer's members (`rounds.phases.Proposer`), their arities, and that it is a
  pytree."""
  check_members(proposer, PROPOSER_MEMBERS, "proposer", _PROPOSER_HELP, decoder_only)
  check_pytree(proposer, "proposer")
