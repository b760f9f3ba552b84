"""Step costs: the time of one decode step of a target or drafter, for c and verify cost.

    timers = cost_timers(target, {"drafter": drafter}, gammas=(1, 3), encoder_tokens=enc,
                         capacity=96)
    seconds = time_costs(timers, repeats=5)
    c = seconds[("drafter", "drafter")] / seconds[("target", 1)]
    verify_cost = seconds[("target", 3 + 1)] / seconds[("target", 1)]
    predictions(alpha, 3, c, verify_cost, measured_speedup)   # the theory's columns

A model's step is a jitted `lax.fori_loop` of `steps` k-token `model.decode` calls on
a started cache (`StepTimer`); a table drafter's (n-gram, prompt lookup) is a loop of
its `next` (`TableStepTimer`). Each step includes an argmax over the vocabulary. The
timers compile on `compile()` (which may run in a worker thread); `time()` must not
run concurrently with anything else.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import theory
from specdec_jax.drafters import ModelDrafter
from specdec_jax.models.model import Model
from specdec_jax.tools.batching import cycled_rows
from specdec_jax.tools.errors import BenchError
from specdec_jax.tools.prompts import random_prompts
from specdec_jax.tools.timing import median_call_seconds


@functools.partial(jax.jit, static_argnames=("steps",))
def _decode_loop(model, cache, tokens, steps):
  """`steps` k-token decodes, each at the same cache offset; feeds back its argmax."""
  start = cache.length

  def body(_, carry):
    cache, tok = carry
    logits, cache = model.decode(tok, cache.with_length(start))
    return cache, jnp.argmax(logits, axis=-1).astype(jnp.int32)

  _, tok = jax.lax.fori_loop(0, steps, body, (cache, tokens))
  return tok


@functools.partial(jax.jit, static_argnames=("steps",))
def _table_loop(drafter, state, token, steps):
  def body(_, carry):
    state, tok = carry
    logits, state = drafter.next(state, tok)
    return state, jnp.argmax(logits, axis=-1).astype(jnp.int32)
  _, tok = jax.lax.fori_loop(0, steps, body, (state, token))
  return tok


class _Timer:
  """`steps` calls in one jitted loop: compile once, then the median per call."""

  steps: int

  def _run(self):
    raise NotImplementedError

  def compile(self):
    self._run()
    self.compiled = True
    return self

  def time(self, repeats: int = 5) -> float:
    """Median seconds per step over `repeats` timed loops."""
    if repeats < 1:
      raise BenchError(f"repeats must be >= 1, got {repeats}")
    if not getattr(self, "compiled", False):
      self.compile()
    return median_call_seconds(self._run, repeats) / self.steps


class StepTimer(_Timer):
  """Times `steps` k-token `model.decode` calls in one jitted `lax.fori_loop`.

  Every call writes at the same offset of a started cache (so it never fills; a
  fixed-shape cache costs the same at every offset) and feeds its argmax back as the
  next input.
  """

  def __init__(self, model, cache, k: int, steps: int = 16, seed: int = 0):
    if k < 1 or steps < 1:
      raise BenchError(f"StepTimer needs k >= 1 and steps >= 1, got {k}, {steps}")
    if cache.capacity < k:
      raise BenchError(f"cache capacity {cache.capacity} < k {k}")
    batch = cache.batch_size
    self.model, self.k, self.steps = model.pack(), k, steps   # a jit argument: packed here
    self.cache = cache.with_length(jnp.full((batch,), (cache.capacity - k) // 2, jnp.int32))
    self.tokens = jnp.asarray(random_prompts(batch, k, model.config.vocab_size, seed + 1))
    self.compiled = False

  def _run(self):
    return jax.block_until_ready(_decode_loop(self.model, self.cache, self.tokens, self.steps))


class TableStepTimer(_Timer):
  """Like `StepTimer` for a table drafter: `steps` `drafter.next` calls + argmax."""

  def __init__(self, drafter, encoder_tokens, capacity: int, steps: int = 16):
    self.drafter, self.steps = drafter, steps
    enc = jnp.asarray(encoder_tokens, jnp.int32)
    batch = enc.shape[0]
    self.state = drafter.init(enc, capacity)
    seq = jnp.zeros((batch, capacity + 1), jnp.int32).at[:, 1:3].set(enc[:, :2])
    _, self.state = drafter.first(self.state, seq, jnp.full((batch,), 2, jnp.int32))
    self.token = enc[:, 0]
    self.compiled = False

  def _run(self):
    return jax.block_until_ready(_table_loop(self.drafter, self.state, self.token, self.steps))


def started_cache(model, encoder_tokens, capacity: int):
  """`model.start` on `encoder_tokens` [B, Le] with `capacity` positions."""
  return model.start(jnp.asarray(encoder_tokens, jnp.int32), capacity)


def drafter_timer(drafter, encoder_tokens, capacity: int, steps: int = 16) -> _Timer:
  """A 1-token step timer of a Model / ModelDrafter, or of a table drafter."""
  model = (drafter.model if isinstance(drafter, ModelDrafter)
           else drafter if isinstance(drafter, Model) else None)
  if model is None:
    return TableStepTimer(drafter, encoder_tokens, capacity, steps)
  return StepTimer(model, started_cache(model, encoder_tokens, capacity), 1, steps)


def cost_timers(target, drafters: dict[str, Any], gammas: Iterable[int], *, encoder_tokens,
                capacity: int, steps: int = 16) -> dict[tuple, _Timer]:
  """Uncompiled timers at one batch size: ("target", 1), ("target", g + 1) for each
  gamma, and ("drafter", name) for each of `drafters`."""
  t_cache = started_cache(target, encoder_tokens, capacity)
  timers: dict[tuple, _Timer] = {("target", 1): StepTimer(target, t_cache, 1, steps)}
  for g in sorted(set(gammas)):
    timers[("target", g + 1)] = StepTimer(target, t_cache, g + 1, steps)
  for name, d in drafters.items():
    timers[("drafter", name)] = drafter_timer(d, encoder_tokens, capacity, steps)
  return timers


def time_costs(timers: dict[tuple, _Timer], repeats: int = 5,
               tick: Callable[[], None] = lambda: None) -> dict[tuple, float]:
  """Seconds per step of every timer (compiling those not compiled yet), one at a time."""
  out = {}
  for key, timer in timers.items():
    out[key] = timer.time(repeats)
    tick()
  return out


def time_decode_step(model, batch: int, k: int, *, encoder_tokens=None, encoder_len: int = 32,
                     capacity: int = 128, steps: int = 16, repeats: int = 5,
                     seed: int = 0) -> float:
  """Seconds per call of `model.decode` with k tokens per row at batch size `batch`.

  Starts a cache of `capacity` positions on `encoder_tokens` (default: random prompts
  of `encoder_len`), compiles a jitted loop of `steps` k-token decodes (`StepTimer`)
  and returns the median over `repeats` timed loops / `steps`.
  """
  if repeats < 1:
    raise BenchError(f"repeats must be >= 1, got {repeats}")
  if encoder_tokens is None:
    encoder_tokens = random_prompts(batch, encoder_len, model.config.vocab_size, seed)
  cache = started_cache(model, cycled_rows(np.asarray(encoder_tokens), batch), capacity)
  return StepTimer(model, cache, k, steps, seed).compile().time(repeats)


def predictions(alpha: float, gamma: int, c: float, verify_cost: float,
                speedup: float) -> dict[str, Any]:
  """The step costs of a speculative row and what the theory predicts from them.

  predicted_speedup = theory.walltime_improvement_measured(alpha, gamma, c, verify_cost);
  predicted_speedup_theorem8 assumes verification free; expected_block_efficiency =
  theory.expected_tokens_per_call(alpha, gamma); measured_over_predicted = speedup / predicted.
  """
  predicted = float(theory.walltime_improvement_measured(alpha, gamma, c, verify_cost))
  return {"c": c, "verify_cost": verify_cost,
          "expected_block_efficiency": float(theory.expected_tokens_per_call(alpha, gamma)),
          "predicted_speedup": predicted,
          "predicted_speedup_theorem8": float(theory.walltime_improvement(alpha, gamma, c)),
          "measured_over_predicted": speedup / predicted}


def explain_run(target, drafter, gamma: int, encoder_tokens, stats: dict[str, Any], *,
                capacity: int, call_tokens: int | None = None, repeats: int = 5,
                steps: int = 16) -> dict[str, Any]:
  """Why a speculative run went as fast as it did: its step costs and its own counts.

  Measures, at the run's batch size (`encoder_tokens` [B, Le], the run's first batch),
  c = one drafter step / one 1-token target step and verify_cost = one target call of
  `call_tokens` tokens (default gamma + 1, the width the run's verify calls had) / one
  1-token call, and combines them with the run's counters (`stats`, as `DecodeOutput.stats`
  or a merged corpus's):

      expected = tokens_per_target_call / (drafts_per_target_call * c + verify_cost)

  the speedup over the target alone if a round cost nothing but its model calls (the
  accounting behind Theorem 8, with the measured counts instead of alpha). A measured
  speedup below it is the rounds' own work: acceptance, cache moves, the loop.

      >>> import specdec_jax as sd, numpy as np
      >>> target = sd.load("config:t5_1_1_tiny")
      >>> stats = {"tokens_per_target_call": 2.0, "drafter_calls": 30, "target_calls": 10}
      >>> r = explain_run(target, target, 3, np.array([[5, 6, 1]]), stats, capacity=16,
      ...                 repeats=1, steps=2)
      >>> sorted(r), r["drafts_per_target_call"]
      (['c', 'call_tokens', 'drafts_per_target_call', 'expected_speedup', 'tokens_per_target_call', 'verify_cost'], 3.0)
  """
  k = gamma + 1 if call_tokens is None else call_tokens
  timers = cost_timers(target, {"drafter": drafter}, [k - 1], encoder_tokens=encoder_tokens,
                       capacity=max(capacity, k), steps=steps)
  seconds = time_costs(timers, repeats)
  c = seconds[("drafter", "drafter")] / seconds[("target", 1)]
  verify_cost = seconds[("target", k)] / seconds[("target", 1)]
  per_call = float(stats["tokens_per_target_call"])
  drafts = float(stats["drafter_calls"]) / max(float(stats["target_calls"]), 1.0)
  return {"c": c, "verify_cost": verify_cost, "call_tokens": k,
          "tokens_per_target_call": per_call, "drafts_per_target_call": drafts,
          "expected_speedup": per_call / (drafts * c + verify_cost)}


def measured_adaptive_gamma(target, drafter, encoder_tokens, gamma_max: int, *,
                            capacity: int, repeats: int = 5, steps: int = 16,
                            **policy) -> "AdaptiveGamma":
  """An `sd.AdaptiveGamma` whose c and verify costs are measured here: c = one drafter step
  over one 1-token target step, verify_cost = (v(2), ..., v(gamma_max + 1)), at the batch
  size of `encoder_tokens` [B, Le] (the policy then picks small gammas where wide verify
  calls are dear, e.g. a CPU at batch 8). `policy`: AdaptiveGamma's other fields."""
  from specdec_jax.decoding.adaptive import AdaptiveGamma
  gammas = range(1, gamma_max + 1)
  seconds = time_costs(cost_timers(target, {"drafter": drafter}, gammas,
                                   encoder_tokens=encoder_tokens,
                                   capacity=max(capacity, gamma_max + 1), steps=steps), repeats)
  one = seconds[("target", 1)]
  return AdaptiveGamma(c=seconds[("drafter", "drafter")] / one,
                       verify_cost=tuple(seconds[("target", g + 1)] / one for g in gammas),
                       **policy)


#: The acceptance rates `projections` evaluates (the issue's "alpha 0.6-0.9").
PROJECTION_ALPHAS = (0.6, 0.7, 0.8, 0.9)


def projections(costs: dict[str, Any], alphas=PROJECTION_ALPHAS) -> list[dict[str, Any]]:
  """What the measured step costs of one batch size promise at other acceptance rates.

  For each alpha: the gamma among the measured ones with the highest
  `theory.walltime_improvement_measured(alpha, gamma, c, verify_cost(gamma))`, that
  speedup, and Theorem 8's (verification free) at the same gamma.
  """
  out = []
  for alpha in alphas:
    best = max(costs["verify"], key=lambda v: float(theory.walltime_improvement_measured(
        alpha, v["gamma"], costs["c"], v["verify_cost"])))
    out.append({"batch_size": costs["batch_size"], "alpha": alpha, "gamma": best["gamma"],
                "verify_cost": best["verify_cost"], "c": costs["c"],
                "projected_speedup": float(theory.walltime_improvement_measured(
                    alpha, best["gamma"], costs["c"], best["verify_cost"])),
                "theorem8_speedup": float(theory.walltime_improvement(alpha, best["gamma"],
                                                                       costs["c"]))})
  return out
