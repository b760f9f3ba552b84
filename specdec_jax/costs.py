"""Step costs: the time of one decode step of a target or drafter, for c and verify cost.

    timers = cost_timers(target, {"drafter": drafter}, gammas=(1, 3), inputs=enc,
                         capacity=96)
    seconds = time_costs(timers, repeats=5)
    c = seconds[("drafter", "drafter")] / seconds[("target", 1)]
    verify_cost = seconds[("target", 3 + 1)] / seconds[("target", 1)]
    predictions(alpha, 3, c, verify_cost, measured_speedup)   # the theory's columns

A model's step is a jitted `lax.fori_loop` of `steps` k-token `model.decode` calls on
a started cache (`StepTimer`); a table drafter's (n-gram, prompt lookup) is a loop of
its `next` (`TableStepTimer`), a Gemma 4 assistant's a loop of its draft step over the
target's started cache (`AssistantStepTimer`). Each step includes an argmax over the vocabulary. The
timers compile on `compile()` (which may run in a worker thread); `time()` must not
run concurrently with anything else.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from typing import TYPE_CHECKING, Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import theory
from specdec_jax.batching import cycled_rows, random_prompts
from specdec_jax.compilation import compiling
from specdec_jax.drafters import GemmaAssistant, ModelDrafter
from specdec_jax.errors import InputError
from specdec_jax.methods import Speculative
from specdec_jax.models.model import Model
from specdec_jax.rounds.engine import EXACT_WIDTH
from specdec_jax.timing import median_call_seconds, time_rounds

if TYPE_CHECKING:
  from specdec_jax.methods.adaptive import AdaptiveGamma


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


@functools.partial(jax.jit, static_argnames=("steps",))
def _assistant_loop(assistant, cache, hidden, token, steps):
  def body(_, carry):
    hidden, tok = carry
    logits, hidden = assistant.step(cache, tok, hidden)
    return hidden, jnp.argmax(logits, axis=-1).astype(jnp.int32)
  _, tok = jax.lax.fori_loop(0, steps, body, (hidden, token))
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
      raise InputError(f"repeats must be >= 1, got {repeats}")
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
      raise InputError(f"StepTimer needs k >= 1 and steps >= 1, got {k}, {steps}")
    if cache.capacity < k:
      raise InputError(f"cache capacity {cache.capacity} < k {k}")
    batch = cache.batch_size
    self.model, self.k, self.steps = model, k, steps   # as given: packed or not (sd.pack)
    self.cache = cache.with_length(jnp.full((batch,), (cache.capacity - k) // 2, jnp.int32))
    # random ids past pad, EOS and unk (on the host: no program to compile for them)
    ids = np.random.RandomState(seed + 1).randint(3, model.config.vocab_size, (batch, k))
    self.tokens = jnp.asarray(ids, jnp.int32)
    self.compiled = False

  def _run(self):
    return jax.block_until_ready(_decode_loop(self.model, self.cache, self.tokens, self.steps))


class TableStepTimer(_Timer):
  """Like `StepTimer` for a table drafter: `steps` `drafter.next` calls + argmax."""

  def __init__(self, drafter, inputs, capacity: int, steps: int = 16):
    self.drafter, self.steps = drafter, steps
    enc = jnp.asarray(inputs, jnp.int32)
    batch = enc.shape[0]
    self.state = drafter.init(enc, capacity)
    seq = jnp.zeros((batch, capacity + 1), jnp.int32).at[:, 1:3].set(enc[:, :2])
    _, self.state = drafter.first(self.state, seq, jnp.full((batch,), 2, jnp.int32))
    self.token = enc[:, 0]
    self.compiled = False

  def _run(self):
    return jax.block_until_ready(_table_loop(self.drafter, self.state, self.token, self.steps))


class AssistantStepTimer(_Timer):
  """Like `TableStepTimer` for a Gemma 4 assistant bound to its target: `steps` draft steps
  over the target's started `cache` (`GemmaAssistant.step`), each feeding its argmax and
  its carried state to the next."""

  def __init__(self, assistant: GemmaAssistant, cache, inputs, steps: int = 16):
    self.assistant, self.cache, self.steps = assistant, cache, steps
    tc = assistant._check_bound()
    self.token = jnp.asarray(inputs, jnp.int32)[:, 0]
    self.hidden = jnp.zeros((cache.batch_size, tc.emb_dim), tc.activation_dtype)
    self.compiled = False

  def _run(self):
    return jax.block_until_ready(_assistant_loop(self.assistant, self.cache, self.hidden,
                                                 self.token, self.steps))


def started_cache(model, inputs, capacity: int):
  """`model.start` on `inputs` [B, Le] with `capacity` positions."""
  return model.start(jnp.asarray(inputs, jnp.int32), capacity)


def drafter_timer(drafter, inputs, capacity: int, steps: int = 16) -> _Timer:
  """A 1-token step timer of a Model / ModelDrafter, or of a table drafter."""
  model = (drafter.model if isinstance(drafter, ModelDrafter)
           else drafter if isinstance(drafter, Model) else None)
  if model is None:
    return TableStepTimer(drafter, inputs, capacity, steps)
  return StepTimer(model, started_cache(model, inputs, capacity), 1, steps)


def cost_timers(target, drafters: dict[str, Any], gammas: Iterable[int], *, inputs,
                capacity: int, steps: int = 16) -> dict[tuple, _Timer]:
  """Uncompiled timers at one batch size: ("target", 1), ("target", g + 1) for each
  gamma, and ("drafter", name) for each of `drafters`."""
  t_cache = started_cache(target, inputs, capacity)
  timers: dict[tuple, _Timer] = {("target", 1): StepTimer(target, t_cache, 1, steps)}
  for g in sorted(set(gammas)):
    timers[("target", g + 1)] = StepTimer(target, t_cache, g + 1, steps)
  for name, d in drafters.items():
    timers[("drafter", name)] = (
        AssistantStepTimer(d.for_target(target), t_cache, inputs, steps)
        if isinstance(d, GemmaAssistant) else drafter_timer(d, inputs, capacity, steps))
  return timers


def time_costs(timers: dict[tuple, _Timer], repeats: int = 5,
               tick: Callable[[], None] = lambda: None) -> dict[tuple, float]:
  """Seconds per step of every timer (compiling those not compiled yet), one at a time."""
  out = {}
  for key, timer in timers.items():
    out[key] = timer.time(repeats)
    tick()
  return out


@dataclasses.dataclass(frozen=True)
class CostTiming:
  """How decode steps are timed (`time_decode_step`, `explain_run`, `bench.measure_costs`).

  Attributes:
    capacity: the KV caches' length (tokens) the steps run at.
    steps: decode steps per jitted loop.
    repeats: timed rounds; the median is reported.
  """

  capacity: int
  steps: int = 16
  repeats: int = 5


def time_decode_step(model, batch: int, k: int, timing: CostTiming = CostTiming(128), *,
                     inputs=None, encoder_len: int = 32, seed: int = 0) -> float:
  """Seconds per call of `model.decode` with k tokens per row at batch size `batch`.

  Starts a cache of `timing.capacity` positions on `inputs` (default: random
  prompts of `encoder_len`), compiles a jitted loop of `timing.steps` k-token decodes
  (`StepTimer`) and returns the median over `timing.repeats` timed loops / `steps`.
  """
  repeats = timing.repeats
  if repeats < 1:
    raise InputError(f"repeats must be >= 1, got {repeats}")
  if inputs is None:
    inputs = random_prompts(batch, encoder_len, model.config.vocab_size, seed)
  cache = started_cache(model, cycled_rows(np.asarray(inputs), batch), timing.capacity)
  return StepTimer(model, cache, k, timing.steps, seed).compile().time(repeats)


#: The footnote of a verify cost shown as "1.00*" (`verify_cost_text`).
VERIFY_NOISE_NOTE = ("*: measured below 1.0, which is timing noise (a wider target call does "
                     "not cost less than a 1-token one): shown, and used, as 1.00")


def verify_cost_floor(verify_cost: float) -> float:
  """The verify cost a prediction uses: the measured one, at least 1.0 (below is noise)."""
  return max(float(verify_cost), 1.0)


def verify_cost_text(verify_cost: float | None, digits: int = 2) -> str:
  """A measured verify cost as reports show it: "1.15", "1.00*" for one below 1.0 (timing
  noise, footnoted by VERIFY_NOISE_NOTE), "—" for None.

  >>> verify_cost_text(1.153), verify_cost_text(0.9), verify_cost_text(None)
  ('1.15', '1.00*', '—')
  """
  if verify_cost is None:
    return "—"
  v = float(verify_cost)
  return f"{1.0:.{digits}f}*" if v < 1.0 else f"{v:.{digits}f}"


def relative_costs(timers: dict[tuple, _Timer], repeats: int = 5,
                   base: tuple = ("target", 1)) -> dict[tuple, float]:
  """Each timer's step time over `base`'s: the median over `repeats` alternating rounds
  (`timing.time_rounds`) of the round's ratio, so a drift of the machine moves both sides
  of a ratio alike. Compiles the timers not compiled yet."""
  if repeats < 1:
    raise InputError(f"repeats must be >= 1, got {repeats}")
  for timer in timers.values():
    if not getattr(timer, "compiled", False):
      timer.compile()
  timed = time_rounds({key: timer._run for key, timer in timers.items()}, repeats)
  per_step = {key: [t / timers[key].steps for t in timed[key]["times_s"]] for key in timers}
  return {key: statistics.median(x / y for x, y in zip(per_step[key], per_step[base], strict=True))
          for key in timers}


def predictions(alpha: float, gamma: int, c: float, verify_cost: float,
                speedup: float) -> dict[str, Any]:
  """The step costs of a speculative row and what the theory predicts from them.

  predicted_speedup = theory.walltime_improvement_measured(alpha, gamma, c, verify_cost)
  with the verify cost at least 1.0 (`verify_cost_floor`: below it is timing noise);
  predicted_speedup_theorem8 assumes verification free; expected_block_efficiency =
  theory.expected_tokens_per_call(alpha, gamma); measured_over_predicted = speedup / predicted.
  """
  predicted = float(theory.walltime_improvement_measured(alpha, gamma, c,
                                                        verify_cost_floor(verify_cost)))
  return {"c": c, "verify_cost": verify_cost,
          "expected_block_efficiency": float(theory.expected_tokens_per_call(alpha, gamma)),
          "predicted_speedup": predicted,
          "predicted_speedup_theorem8": float(theory.walltime_improvement(alpha, gamma, c)),
          "measured_over_predicted": speedup / predicted}


def shown_predictions(row: dict[str, Any]) -> dict[str, Any]:
  """A result row's predicted_speedup and measured_over_predicted as a table shows them:
  recomputed by `predictions` (verify cost floored at 1.0) where the stored ones were made
  from a verify cost below 1.0 (timing noise); the stored ones otherwise."""
  keys = ("predicted_speedup", "measured_over_predicted")
  v = row.get("verify_cost")
  if v is None or float(v) >= 1.0 or any(row.get(k) is None for k in ("alpha", "gamma", "c")):
    return {k: row.get(k) for k in keys}
  p = predictions(row["alpha"], int(row["gamma"]), row["c"], v, row["speedup"])
  return {k: p[k] for k in keys}


def explain_run(target, drafter, gamma: int, inputs, stats: dict[str, Any],
                timing: CostTiming, *, call_tokens: int | None = None) -> dict[str, Any]:
  """Why a speculative run went as fast as it did: its step costs and its own counts.

  Measures, at the run's batch size (`inputs` [B, Le], the run's first batch),
  c = one drafter step / one 1-token target step and verify_cost = one target call of
  `call_tokens` tokens (default gamma + 1, the width the run's verify calls had) / one
  1-token call, each the median ratio of `timing.repeats` alternating rounds of
  `timing.steps`-step loops at cache length `timing.capacity` (`relative_costs`),
  and combines them with the run's counters (`stats`, as `DecodeOutput.stats` or a merged
  corpus's):

      round_cost = drafts_per_target_call * c + max(verify_cost, 1)    # in target steps
      expected = tokens_per_target_call / round_cost

  `expected` is the speedup over the target alone if a round cost nothing but its model
  calls (the accounting behind Theorem 8, with the measured counts instead of alpha); a
  measured speedup below it is the rounds' own work: acceptance, cache moves, the loop.
  `verify_cost_noise`: the measured verify cost was below 1.0 (timing noise).

      >>> import specdec_jax as sd, numpy as np
      >>> target = sd.load("config:t5_1_1_tiny")
      >>> stats = {"tokens_per_target_call": 2.0, "drafter_calls": 30, "target_calls": 10}
      >>> r = explain_run(target, target, 3, np.array([[5, 6, 1]]), stats,
      ...                 CostTiming(capacity=16, steps=2, repeats=1))
      >>> sorted(r)[:4], r["drafts_per_target_call"]
      (['c', 'call_tokens', 'drafts_per_target_call', 'expected_speedup'], 3.0)
      >>> sorted(r)[4:]
      ['repeats', 'round_cost', 'tokens_per_target_call', 'verify_cost', 'verify_cost_noise']
  """
  k = gamma + 1 if call_tokens is None else call_tokens
  repeats = timing.repeats
  timers = cost_timers(target, {"drafter": drafter}, [k - 1], inputs=inputs,
                       capacity=max(timing.capacity, k), steps=timing.steps)
  ratio = relative_costs(timers, repeats)
  c, verify_cost = ratio[("drafter", "drafter")], ratio[("target", k)]
  per_call = float(stats["tokens_per_target_call"])
  drafts = float(stats["drafter_calls"]) / max(float(stats["target_calls"]), 1.0)
  round_cost = drafts * c + verify_cost_floor(verify_cost)
  return {"c": c, "verify_cost": verify_cost, "verify_cost_noise": verify_cost < 1.0,
          "call_tokens": k, "repeats": repeats, "tokens_per_target_call": per_call,
          "drafts_per_target_call": drafts, "round_cost": round_cost,
          "expected_speedup": per_call / round_cost}


def measured_adaptive_gamma(target, drafter, inputs, gamma_max: int, *,
                            capacity: int, repeats: int = 5, steps: int = 16,
                            **policy) -> "AdaptiveGamma":
  """An `sd.AdaptiveGamma` whose c and verify costs are measured here: c = one drafter step
  over one 1-token target step, verify_cost = (v(2), ..., v(gamma_max + 1)), at the batch
  size of `inputs` [B, Le] (the policy then picks small gammas where wide verify
  calls are dear, e.g. a CPU at batch 8). `policy`: AdaptiveGamma's other fields."""
  from specdec_jax.methods.adaptive import AdaptiveGamma
  gammas = range(1, gamma_max + 1)
  seconds = time_costs(cost_timers(target, {"drafter": drafter}, gammas,
                                   inputs=inputs,
                                   capacity=max(capacity, gamma_max + 1), steps=steps), repeats)
  one = seconds[("target", 1)]
  return AdaptiveGamma(c=seconds[("drafter", "drafter")] / one,
                       verify_cost=tuple(seconds[("target", g + 1)] / one for g in gammas),
                       **policy)


#: The acceptance rates `projections` evaluates (the issue's "alpha 0.6-0.9").
PROJECTION_ALPHAS = theory.PROJECTION_ALPHAS


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


def has_cost_model(method) -> bool:
  """Whether `explain_method` explains `method`: a speculative method whose drafter runs
  model steps of its own (an early exit shares the target's cache: no c to measure)."""
  return (isinstance(method, Speculative)
          and not getattr(method.drafter, "shares_target_cache", False))


def explain_method(target, method, inputs, stats: dict[str, Any], max_new_tokens: int, *,
                   exact: bool = False, cache_dir: str | None = None) -> dict[str, Any] | None:
  """`explain_run` of a method value that `has_cost_model` (None otherwise), measured at
  its batch size, with its verify calls' width (`exact`: exact mode pads them to
  `EXACT_WIDTH`, off the kernels, on a target whose decode is not width-invariant);
  `inputs` [B, L] its first batch, `stats` its run's; `cache_dir`: the persistent
  compilation cache its timers compile into (`compilation.compiling`)."""
  if not has_cost_model(method):
    return None
  gamma = method.gamma
  padded = exact and not target.width_invariant_decode
  with compiling("the model-step timers of the 'why' line", cache_dir):
    return explain_run(target, method.drafter, gamma, inputs, stats,
                       CostTiming(capacity=max_new_tokens + EXACT_WIDTH + 1),
                       call_tokens=EXACT_WIDTH if padded else gamma + 1)
