"""Speculative sampling (Leviathan et al., Algorithm 1): batched, ragged, one jitted loop.

One round, per row (p = target, q = drafter, both standardised by the same
sampling transform; n = tokens emitted so far; gamma drafts):

  1. draft    x_1..x_gamma ~ q_1..q_gamma        (gamma drafter calls, full q kept)
  2. verify   p_1..p_{gamma+1} = target([seq[n], x_1..x_gamma])   (ONE k-token call)
  3. accept   x_i while r_i * q_i(x_i) < p_i(x_i), r_i ~ U[0, 1)  -> m accepted
  4. next     t ~ norm(max(0, p_{m+1} - q_{m+1})) if m < gamma, else t ~ p_{gamma+1}
  5. emit     x_1..x_m, t  (cut after EOS and at max_new_tokens)

Both caches are rolled back by length only: the target's to n + m + 1 (its
stale drafts beyond are never read), the drafter's by its next `first` call.
Under `Greedy` p and q are one-hot, so the rule accepts exactly the drafts
that equal the target's argmax and t is the target's argmax: the output is
token-identical to greedy decoding of the target. Under sampling the output
distribution equals the target's (tested by exact enumeration).

Pure pieces:  init_state / round_step / cond / finish;  `speculative_generate` jits them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax import drafters as drafters_lib
from specdec_jax import sampling as sampling_lib
from specdec_jax.cache import DecoderCache
from specdec_jax.decoding import common
from specdec_jax.model import InputError, Model

Array = jax.Array


# ----------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class AdaptiveGamma:
  """Per-row gamma chosen on device each round (an extension beyond the paper).

  Each row tracks an exponential moving average of its acceptance estimate
  alpha (mean of beta = sum_x min(p, q) over the round's scored positions) and
  takes the gamma in 1..gamma_max that maximises Theorem 8's expected walltime
  improvement (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) for the
  drafter's cost ratio `c`.
  """

  c: float = 0.05
  decay: float = 0.7
  initial_alpha: float = 0.6

  def __post_init__(self):
    if not 0.0 <= self.decay < 1.0:
      raise InputError(f"AdaptiveGamma.decay must be in [0, 1), got {self.decay}")
    if self.c < 0:
      raise InputError(f"AdaptiveGamma.c must be >= 0, got {self.c}")

  def choose(self, alpha: Array, gamma_max: int) -> Array:
    """[B] alpha -> [B] int32 gamma in 1..gamma_max."""
    g = jnp.arange(1, gamma_max + 1, dtype=jnp.float32)
    a = jnp.clip(alpha, 0.0, 0.999)[:, None]
    improvement = (1.0 - a ** (g + 1)) / ((1.0 - a) * (g * self.c + 1.0))
    return (jnp.argmax(improvement, axis=1) + 1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class SpecConfig:
  """Static settings of a speculative run (hashable: a jit static argument).

  lenience < 1 is LOSSY (Leviathan et al. A.5): sampling accepts when
  r * lenience * q(x) < p(x); greedy accepts x when p_raw(x) >= lenience * max p_raw.
  """

  gamma: int
  max_new_tokens: int
  sampling: sampling_lib.SamplingMethod = sampling_lib.Greedy()
  eos_id: int = 1
  lenience: float = 1.0
  adaptive: AdaptiveGamma | None = None

  def __post_init__(self):
    if not isinstance(self.gamma, int) or isinstance(self.gamma, bool) or self.gamma < 1:
      raise InputError(f"gamma must be an integer >= 1, got {self.gamma!r}")
    if not 0.0 < self.lenience <= 1.0:
      raise InputError(f"lenience must be in (0, 1] (1 = exact), got {self.lenience!r}")

  @property
  def lossy(self) -> bool:
    return self.lenience < 1.0


# ----------------------------------------------------------------------------- state


@struct.dataclass
class SpecStats:
  """Per-row counters accumulated on device ([B] unless noted)."""

  target_calls: Array
  drafter_calls: Array
  drafted: Array
  accepted: Array
  per_position_accepted: Array  # [B, gamma]: rounds in which draft i was accepted
  beta_sum: Array               # sum of beta = sum_x min(p, q) over scored positions
  beta_count: Array


@struct.dataclass
class SpecState:
  """Loop state. seq/n/done follow `common`; caches hold every emitted token but the last."""

  seq: Array
  n: Array
  done: Array
  target_cache: DecoderCache
  drafter_state: Any
  rng: Array
  gamma: Array       # [B] int32 drafts per round (fixed unless adaptive)
  alpha_ema: Array   # [B] float32
  stats: SpecStats


def init_state(target: Model, drafter, encoder_tokens: Array, config: SpecConfig, rng: Array,
               drafter_encoder_tokens: Array | None = None) -> SpecState:
  """Run each model's encoder once; empty caches sized max_new_tokens + gamma + 1."""
  batch = encoder_tokens.shape[0]
  capacity = config.max_new_tokens + config.gamma + 1
  zeros = jnp.zeros((batch,), jnp.int32)
  d_tokens = encoder_tokens if drafter_encoder_tokens is None else drafter_encoder_tokens
  gamma0 = jnp.full((batch,), config.gamma, jnp.int32)
  alpha0 = jnp.full((batch,), config.adaptive.initial_alpha if config.adaptive else 0.0)
  if config.adaptive:
    gamma0 = config.adaptive.choose(alpha0, config.gamma)
  return SpecState(
      seq=common.init_sequence(batch, config.max_new_tokens, target.config.decoder_start_id),
      n=zeros, done=jnp.zeros((batch,), jnp.bool_),
      target_cache=target.start(encoder_tokens, capacity),
      drafter_state=drafter.init(d_tokens, capacity),
      rng=rng, gamma=gamma0, alpha_ema=alpha0.astype(jnp.float32),
      stats=SpecStats(target_calls=zeros, drafter_calls=zeros, drafted=zeros, accepted=zeros,
                      per_position_accepted=jnp.zeros((batch, config.gamma), jnp.int32),
                      beta_sum=jnp.zeros((batch,), jnp.float32), beta_count=zeros))


# ----------------------------------------------------------------------------- one round


def draft(drafter, drafter_state, seq: Array, n: Array, steps: Array, gamma_max: int,
          sampling: sampling_lib.SamplingMethod, rng: Array):
  """Propose up to gamma_max tokens per row (`steps` drafter calls, a traced scalar).

  Returns (tokens [B, gamma_max] int32, q [B, gamma_max, V] float32, drafter_state).
  Positions >= steps are left as token 0 with q = 0; the caller never accepts them.
  """
  logits, drafter_state = drafter.first(drafter_state, seq, n)
  batch, vocab = logits.shape
  keys = jax.random.split(rng, gamma_max)
  tokens = jnp.zeros((batch, gamma_max), jnp.int32)
  q = jnp.zeros((batch, gamma_max, vocab), jnp.float32)

  def body(i, carry):
    logits, tokens, q, ds = carry
    x = sampling_lib.sample(keys[i], logits, sampling)
    tokens = tokens.at[:, i].set(x)
    q = q.at[:, i].set(sampling_lib.probs(logits, sampling))
    # The last draft needs no further drafter call.
    logits, ds = jax.lax.cond(i + 1 < steps, lambda: drafter.next(ds, x), lambda: (logits, ds))
    return logits, tokens, q, ds

  _, tokens, q, drafter_state = jax.lax.fori_loop(0, steps, body,
                                                  (logits, tokens, q, drafter_state))
  return tokens, q, drafter_state


def accept(p: Array, q: Array, tokens: Array, gamma: Array, rng: Array, config: SpecConfig,
           raw_p: Array | None = None) -> tuple[Array, Array]:
  """The modified rejection rule, per row.

  Args:
    p: [B, gamma_max + 1, V] target distributions; q: [B, gamma_max, V] drafter's.
    tokens: [B, gamma_max] drafts; gamma: [B] drafts that count in each row.
    raw_p: [B, gamma_max, V] unstandardised target softmax (greedy lenience only).
  Returns:
    m: [B] number of accepted drafts; next_token: [B] the correction / bonus token.
  """
  batch, gamma_max = tokens.shape
  k_accept, k_next = jax.random.split(rng)
  p_x = jnp.take_along_axis(p[:, :-1], tokens[..., None], axis=-1)[..., 0]   # [B, g]
  q_x = jnp.take_along_axis(q, tokens[..., None], axis=-1)[..., 0]
  if config.sampling.is_greedy and config.lossy:
    rp_x = jnp.take_along_axis(raw_p, tokens[..., None], axis=-1)[..., 0]
    ok = (p_x > 0) | (rp_x >= config.lenience * jnp.max(raw_p, axis=-1))
  else:
    r = jax.random.uniform(k_accept, p_x.shape)
    ok = r * (config.lenience * q_x) < p_x
  ok = ok & (jnp.arange(gamma_max)[None] < gamma[:, None])
  m = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)               # [B]

  p_next = jnp.take_along_axis(p, m[:, None, None], axis=1)[:, 0]               # [B, V]
  q_next = jnp.take_along_axis(q, jnp.minimum(m, gamma_max - 1)[:, None, None], axis=1)[:, 0]
  residual = jnp.maximum(p_next - q_next, 0.0)
  rejected = m < gamma
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  # p == q makes a rejection impossible; the guard only avoids 0/0 in unused lanes.
  dist = jnp.where(rejected[:, None] & (mass > 0), residual / jnp.maximum(mass, 1e-30), p_next)
  if config.sampling.is_greedy:
    next_token = jnp.argmax(dist, axis=-1).astype(jnp.int32)
  else:
    next_token = jax.random.categorical(k_next, jnp.log(dist), axis=-1).astype(jnp.int32)
  return m, next_token


def round_step(target: Model, drafter, state: SpecState, config: SpecConfig) -> SpecState:
  """One drafter/verifier round for every live row."""
  g = config.gamma
  rng, k_draft, k_accept = jax.random.split(state.rng, 3)
  live = ~state.done
  gamma = jnp.where(live, state.gamma, 0)
  steps = jnp.max(gamma)

  tokens, q, drafter_state = draft(drafter, state.drafter_state, state.seq, state.n, steps, g,
                                   config.sampling, k_draft)
  verify_in = jnp.concatenate([common.last_tokens(state.seq, state.n, 1), tokens], axis=1)
  logits, target_cache = target.decode(verify_in, state.target_cache.with_length(state.n))
  p = sampling_lib.probs(logits, config.sampling)                            # [B, g+1, V]
  raw_p = (jax.nn.softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
           if config.sampling.is_greedy and config.lossy else None)
  m, next_token = accept(p, q, tokens, gamma, k_accept, config, raw_p)

  candidates = jnp.where(jnp.arange(g + 1)[None] < m[:, None],
                         jnp.pad(tokens, ((0, 0), (0, 1))), next_token[:, None])
  seq, n, done, _ = common.emit(state.seq, state.n, state.done, candidates, m + 1,
                                config.eos_id)

  # beta_i = sum_x min(p_i, q_i) at the drafted positions the target actually scored
  # on its own path: i <= m (the first rejected one included), i < gamma.
  beta = jnp.sum(jnp.minimum(p[:, :-1], q), axis=-1)                          # [B, g]
  scored = (jnp.arange(g)[None] <= m[:, None]) & (jnp.arange(g)[None] < gamma[:, None])
  beta_sum = jnp.sum(jnp.where(scored, beta, 0.0), axis=1)
  beta_count = jnp.sum(scored, axis=1).astype(jnp.int32)

  s, live_i = state.stats, live.astype(jnp.int32)
  stats = SpecStats(
      target_calls=s.target_calls + live_i,
      drafter_calls=s.drafter_calls + live_i * steps,
      drafted=s.drafted + gamma,
      accepted=s.accepted + m * live_i,
      per_position_accepted=s.per_position_accepted
      + ((jnp.arange(g)[None] < m[:, None]) & live[:, None]).astype(jnp.int32),
      beta_sum=s.beta_sum + beta_sum * live, beta_count=s.beta_count + beta_count * live_i)

  alpha_ema, new_gamma = state.alpha_ema, state.gamma
  if config.adaptive is not None:
    round_alpha = beta_sum / jnp.maximum(beta_count, 1)
    d = config.adaptive.decay
    alpha_ema = jnp.where(live & (beta_count > 0), d * alpha_ema + (1 - d) * round_alpha,
                          alpha_ema)
    new_gamma = config.adaptive.choose(alpha_ema, g)

  return SpecState(seq=seq, n=n, done=done, target_cache=target_cache.with_length(n),
                   drafter_state=drafter_state, rng=rng, gamma=new_gamma, alpha_ema=alpha_ema,
                   stats=stats)


def cond(state: SpecState) -> Array:
  return ~jnp.all(state.done)


def finish(state: SpecState, config: SpecConfig) -> common.DecodeOutput:
  s = state.stats
  per_row = {
      "target_calls": s.target_calls, "drafter_calls": s.drafter_calls, "drafted": s.drafted,
      "accepted": s.accepted,
      "acceptance_rate": s.accepted / jnp.maximum(s.drafted, 1),
      "tokens_per_target_call": state.n / jnp.maximum(s.target_calls, 1),
      "alpha": s.beta_sum / jnp.maximum(s.beta_count, 1),
      "per_position_accepted": s.per_position_accepted,
  }
  total = lambda x: jnp.sum(x, axis=0)
  stats = {
      "target_calls": total(s.target_calls),
      "rounds": jnp.max(s.target_calls),
      "drafter_calls": total(s.drafter_calls),
      "drafted": total(s.drafted),
      "accepted": total(s.accepted),
      "acceptance_rate": total(s.accepted) / jnp.maximum(total(s.drafted), 1),
      "tokens_per_target_call": total(state.n) / jnp.maximum(total(s.target_calls), 1),
      "alpha": total(s.beta_sum) / jnp.maximum(total(s.beta_count), 1),
      "per_position_accepted": total(s.per_position_accepted),
      "gamma": config.gamma,
      "lenience": config.lenience,
      "lossy": config.lossy,
      **{f"{k}_per_row": v for k, v in per_row.items()},
  }
  return common.output_from(state.seq, state.n, stats)


# ----------------------------------------------------------------------------- driver


@functools.partial(jax.jit, static_argnames=("config",))
def _speculative_loop(target, drafter, encoder_tokens, drafter_encoder_tokens, rng, *, config):
  state = init_state(target, drafter, encoder_tokens, config, rng, drafter_encoder_tokens)
  state = jax.lax.while_loop(
      cond, functools.partial(round_step, target, drafter, config=config), state)
  return finish(state, config)


def speculative_generate(target: Model, drafter, encoder_tokens, gamma: int = 5,
                         max_new_tokens: int = 64,
                         sampling: sampling_lib.SamplingMethod | None = None, rng=None,
                         eos_id: int | None = None, lenience: float = 1.0,
                         adaptive: AdaptiveGamma | bool | None = None,
                         drafter_encoder_tokens=None) -> common.DecodeOutput:
  """Speculative decoding of `encoder_tokens` [B, Le] with a drafter.

  Args:
    target: the verifier model.
    drafter: a `Model` with the same vocabulary, or any drafter from `specdec_jax.drafters`.
    gamma: drafts per round (the maximum, with `adaptive`).
    sampling: `sd.Greedy()` (default) or `sd.Sampling(temperature, top_k, top_p)`,
      applied identically to target and drafter distributions.
    lenience: 1 is exact; < 1 is lossy (reported in stats["lossy"]).
    adaptive: `True` or an `AdaptiveGamma` for per-row gamma chosen on device.
    drafter_encoder_tokens: the drafter's input if it differs (defaults to the target's).
  Returns:
    DecodeOutput(tokens [B, max_new_tokens], lengths [B], stats).
  """
  encoder_tokens = common.check_request(encoder_tokens, target.config, max_new_tokens)
  drafter = drafters_lib.as_drafter(drafter, target)
  if isinstance(drafter, drafters_lib.ModelDrafter):
    d_tokens = encoder_tokens if drafter_encoder_tokens is None else drafter_encoder_tokens
    d_tokens = common.check_request(d_tokens, drafter.model.config, max_new_tokens)
  else:
    d_tokens = encoder_tokens
  if adaptive is True:
    adaptive = AdaptiveGamma()
  config = SpecConfig(gamma=gamma, max_new_tokens=int(max_new_tokens),
                      sampling=sampling_lib.as_method(sampling),
                      eos_id=common.resolve_eos(eos_id, target.config), lenience=float(lenience),
                      adaptive=adaptive or None)
  return _speculative_loop(target, drafter, encoder_tokens, d_tokens, common.as_rng(rng),
                           config=config)
