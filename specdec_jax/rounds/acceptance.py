"""Acceptance rules: given the target's logits over [last, x_1 .. x_G], keep a prefix of the
proposals and pick the target's next token. Each rule is a frozen dataclass (a static,
hashable value) that the engine calls; write your own with the same signature
(`phases.AcceptRule`, docs/extending/acceptance.md); `check_rule` refuses, before any
tracing, a rule the engine could not take.

    TargetOnly()                        no proposals: the next token is the target's (baseline)
    SpeculativeSampling()               Leviathan et al.'s rule: exact (output ~ the target)
    SpeculativeSampling(lenience=0.5)   their lossy variant (A.5), labelled lossy
    Rollback(rollback_threshold=2.0)   BiLD's rollback policy (lossy)

Greedy decoding is the special case of one-hot p and q: `SpeculativeSampling()` keeps
the proposals that equal the target's argmax (the longest-prefix rule of blockwise
decoding) and its next token is the target's argmax, so the output is the target's
greedy output token for token.

Worked example (greedy, G = 3, V = 5; one row; argmax of each logits row in brackets)::

    proposals  x = [2, 4, 1]                count 3
    logits     at [last, 2, 4, 1] -> argmax [2, 4, 3, 0]
    matches    x_i == argmax_i     [yes, yes, no]
    m = 2 (keep 2, 4);  next_token = argmax at position m = 3   -> emits 2, 4, 3
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import jax
import jax.numpy as jnp

from specdec_jax import sampling as sampling_lib
from specdec_jax.errors import InputError
from specdec_jax.rounds.phases import Acceptance, Proposal

Array = jax.Array


def check_rule(rule: Any, what: str = "accept") -> None:
  """Refuse a rule `jax.jit` cannot take as a static argument, or that cannot be called as
  rule(logits, proposal, sampling, key): not callable, a dataclass that is not frozen, or
  a value that is not hashable (an array field, say)."""
  name = type(rule).__name__
  if not callable(rule):
    raise InputError(f"{what} must be an acceptance rule: a frozen dataclass called as "
                     f"rule(logits, proposal, sampling, key) -> Acceptance (sd.AcceptRule), "
                     f"got {rule!r}")
  if (dataclasses.is_dataclass(rule) and not isinstance(rule, type)
      and not type(rule).__dataclass_params__.frozen):         # type: ignore[attr-defined]
    raise InputError(f"the acceptance rule {name} must be a frozen dataclass "
                     "(@dataclasses.dataclass(frozen=True)): the engine takes it as a static, "
                     "hashable jax.jit argument, compared by its settings")
  try:
    hash(rule)
  except TypeError as e:
    raise InputError(f"the acceptance rule {name} must be hashable, a frozen dataclass of "
                     f"settings (numbers, strings; no arrays): the engine takes it as a static "
                     f"jax.jit argument ({e})") from None
  try:
    signature = inspect.signature(rule)
  except (TypeError, ValueError):     # a builtin or a C callable: nothing to read
    return
  try:
    signature.bind("logits", "proposal", "sampling", "key")
  except TypeError as e:
    raise InputError(f"the acceptance rule {name} cannot be called as "
                     f"rule(logits, proposal, sampling, key): {e}") from None


def prefix_length(ok: Array) -> Array:
  """bool [B, G] -> int32 [B]: number of leading True values of each row."""
  return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)


def _at(x: Array, tokens: Array) -> Array:
  """x [B, G, V] at `tokens` [B, G] -> [B, G]."""
  return jnp.take_along_axis(x, tokens[..., None], axis=-1)[..., 0]


def _row(x: Array, index: Array) -> Array:
  """x [B, K, ...] at per-row position `index` [B] -> [B, ...]."""
  return jnp.take_along_axis(x, index.reshape((-1,) + (1,) * (x.ndim - 1)), axis=1)[:, 0]


def _valid(proposal: Proposal) -> Array:
  """bool [B, G]: real proposal slots."""
  return jnp.arange(proposal.tokens.shape[1])[None] < proposal.count[:, None]


@dataclasses.dataclass(frozen=True)
class TargetOnly:
  """No proposals: the next token is drawn from the target (the autoregressive baseline)."""

  lossy = False

  def __call__(self, logits, proposal, sampling, key) -> Acceptance:
    batch, g = proposal.tokens.shape
    return Acceptance(m=jnp.zeros((batch,), jnp.int32),
                      next_token=sampling_lib.draw(key, logits[:, 0], sampling),
                      beta=jnp.zeros((batch, g), jnp.float32),
                      scored=jnp.zeros((batch, g), jnp.bool_))


@dataclasses.dataclass(frozen=True)
class SpeculativeSampling:
  """The modified rejection rule (Leviathan et al., Algorithm 1), per row.

  Sampling: accept x_i while r_i * q_i(x_i) < p_i(x_i), r_i ~ U[0, 1); after the first
  rejection at i = m draw the next token from norm(max(0, p_m - q_m)); if all `count`
  proposals are accepted draw a bonus token from p_count. p and q are the target's and
  proposer's distributions after the SAME sampling transform; the output then has the
  target's distribution. beta_i = sum_x min(p_i(x), q_i(x)).

  lenience < 1 is LOSSY (their A.5): sampling accepts when r * lenience * q(x) < p(x);
  greedy accepts x when p_raw(x) >= lenience * max p_raw (p_raw: the target's softmax).
  """

  lenience: float = 1.0

  def __post_init__(self):
    if not 0.0 < self.lenience <= 1.0:
      raise InputError(f"lenience must be in (0, 1] (1 = exact), got {self.lenience!r}")

  @property
  def lossy(self) -> bool:
    return self.lenience < 1.0

  def __call__(self, logits, proposal, sampling, key) -> Acceptance:
    if sampling.is_greedy:
      return self._greedy(logits, proposal)
    return self._sample(logits, proposal, sampling, key)

  def _greedy(self, logits: Array, proposal: Proposal) -> Acceptance:
    x, g = proposal.tokens, proposal.tokens.shape[1]
    best = sampling_lib.argmax(logits)                                # [B, G + 1]
    match = x == best[:, :g]
    ok = match
    if self.lossy:
      raw = jax.nn.softmax(logits[:, :g], axis=-1)
      ok = ok | (_at(raw, x) >= self.lenience * jnp.max(raw, axis=-1))
    valid = _valid(proposal)
    m = prefix_length(ok & valid)
    scored = (jnp.arange(g)[None] <= m[:, None]) & valid
    return Acceptance(m=m, next_token=_row(best, m), beta=match.astype(jnp.float32),
                      scored=scored)

  def _sample(self, logits, proposal, sampling, key) -> Acceptance:
    if proposal.q is None:
      raise InputError("the exact sampling rule needs the proposer's distributions q")
    x, q, g = proposal.tokens, proposal.q, proposal.tokens.shape[1]
    k_accept, k_next = jax.random.split(key)
    p = sampling_lib.probs(logits, sampling)                           # [B, G + 1, V]
    p_x, q_x = _at(p[:, :-1], x), _at(q, x)
    r = jax.random.uniform(k_accept, p_x.shape)
    valid = _valid(proposal)
    m = prefix_length((r * (self.lenience * q_x) < p_x) & valid)
    p_next = _row(p, m)                                                # [B, V]
    if g:
      residual = jnp.maximum(p_next - _row(q, jnp.minimum(m, g - 1)), 0.0)
      mass = jnp.sum(residual, axis=-1, keepdims=True)
      rejected = (m < proposal.count)[:, None]
      # p == q makes a rejection impossible; the guard only avoids 0/0 in unused lanes.
      p_next = jnp.where(rejected & (mass > 0), residual / jnp.maximum(mass, 1e-30), p_next)
    next_token = jax.random.categorical(k_next, jnp.log(p_next), axis=-1).astype(jnp.int32)
    beta = jnp.sum(jnp.minimum(p[:, :-1], q), axis=-1)
    scored = (jnp.arange(g)[None] <= m[:, None]) & valid
    return Acceptance(m=m, next_token=next_token, beta=beta, scored=scored)




@dataclasses.dataclass(frozen=True)
class Rollback:
  """BiLD's rollback policy (Kim et al., Algorithm 1, lines 10-16).

  The large model's distance to the small model's token x_i is the cross-entropy of
  the hard label under its soft label, d_i = -log p_L(x_i) (p_L: its softmax at
  temperature 1, whatever the sampling transform). Keep x_i while d_i <= the
  threshold; at the first m with d_m > threshold roll back: drop x_m.. and take the
  large model's token there (drawn with the run's sampling transform); if none is
  dropped, append the large model's next token. beta_i = p_L(x_i).

  Worked example (threshold 2.0, i.e. keep while p_L(x) >= e^-2 = 0.135)::

      p_L(x_i) = [0.9, 0.4, 0.05, 0.8]  ->  d = [0.11, 0.92, 3.0, 0.22]
      m = 2: keep x_1 x_2, replace x_3 by the large model's token, drop x_4
  """

  rollback_threshold: float

  def __post_init__(self):
    t = self.rollback_threshold
    if not isinstance(t, (int, float)) or not t > 0:   # NaN fails too
      raise InputError(f"rollback_threshold must be > 0 (inf: never roll back), got {t!r}")

  lossy = True

  def __call__(self, logits, proposal, sampling, key) -> Acceptance:
    x, g = proposal.tokens, proposal.tokens.shape[1]
    log_p = jax.nn.log_softmax(logits[:, :g].astype(jnp.float32), axis=-1)
    distance = -_at(log_p, x)                                          # [B, G]
    valid = _valid(proposal)
    m = prefix_length((distance <= self.rollback_threshold) & valid)
    next_token = sampling_lib.draw(key, _row(logits, m), sampling)
    scored = (jnp.arange(g)[None] <= m[:, None]) & valid
    return Acceptance(m=m, next_token=next_token, beta=jnp.exp(-distance), scored=scored)
