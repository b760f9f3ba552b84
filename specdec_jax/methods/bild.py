"""BiLD, the Big Little Decoder (`sd.BiLD`; Kim et al., NeurIPS 2023), on the round engine.

Algorithm 1 (one row): the small model proposes while it is confident,
max p_S > fallback_threshold, for at most `max_small_steps` consecutive tokens;
then the large model runs ONCE over every not-yet-verified small token plus one
position (the small model's unsure proposal is discarded); at the first small
token y_m with -log p_L(y_m) > rollback_threshold it rolls back: y_m.. are dropped
and y_m becomes the large model's token; otherwise the large model's next token is
appended. A sentence the small model ends (EOS) is final, unverified: Algorithm 1
stops when the last token is EOS. So is a buffer the small model fills.

    propose   DraftLoop(small, stop=Unsure(fallback_threshold), final_at_eos=True),
              at most max_small_steps proposals      -> the fallback policy
    verify    one call of the large model, skipped when every live row is final
    accept    acceptance.Rollback(rollback_threshold) -> the rollback policy
    commit    as every method: both caches roll back by length

Batched semantics (B > 1, fixed shapes; `batch_policy`):
  "wait" (default): a row that falls back waits, its proposals kept, until every row
      has fallen back or hit the cap; then one large call verifies all rows. Each row
      follows Algorithm 1 exactly, as if decoded alone; the small model runs for the
      slowest row (rows that wait ride along in the batched small calls).
  "sync": the first row to fall back stops every row's drafting: rows still confident
      are verified early (their small-model run is cut short, which can change their
      tokens). Fewer small calls per large call, more large calls.

BiLD is lossy by design: `stats["lossy"]` is True, except at fallback_threshold 1.0 (the
small model always hands over: the large model's output, exactly). Its statistics: `fallbacks`
(rounds ended because the small model was unsure), `rejections` (rollbacks),
`drafter_tokens` / `target_tokens` (tokens each model produced), `drafter_calls` /
`target_calls` (small / large calls per row), `tokens_per_target_call`, and
`fallback_rate` / `rollback_rate` (per emitted token).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import DraftLoop, Unsure, as_drafter, protocol
from specdec_jax.drafters.early_exit import EarlyExitDrafter
from specdec_jax.errors import InputError
from specdec_jax.methods.autoregressive import Autoregressive
from specdec_jax.methods.base import Method, carried, check_exact, setting
from specdec_jax.methods.speculative import drafter_inputs
from specdec_jax.models.model import Model
from specdec_jax.rounds import engine, requests
from specdec_jax.rounds.acceptance import Rollback
from specdec_jax.rounds.phases import Proposal, Verified
from specdec_jax.rounds.stats import COMMON_STATS, PROPOSED

BATCH_POLICIES = ("wait", "sync")
#: The most consecutive small-model tokens (BiLD's gamma; the paper uses 10): a round keeps
#: max_small_steps proposals per row and the large model verifies them in one call.
MAX_SMALL_STEPS = 64


def verify_unless_final(target: Model, state: engine.RoundState, proposal: Proposal,
                        call_width: int = 0) -> Verified:
  """`engine.verify`, skipped (ran=False) when every live row's proposals are final."""
  needed = jnp.any(~state.done & ~proposal.final)
  real = lambda: engine.verify(target, state, proposal, call_width)
  shape = jax.eval_shape(real)

  def skip() -> Verified:
    cache = state.cache if proposal.target_cache is None else proposal.target_cache
    return Verified(logits=jnp.zeros(shape.logits.shape, shape.logits.dtype),
                    hidden=jnp.zeros(shape.hidden.shape, shape.hidden.dtype),
                    cache=cache, ran=jnp.zeros((), jnp.bool_))

  return jax.lax.cond(needed, real, skip)


def check_thresholds(fallback_threshold: float, rollback_threshold: float,
                     max_small_steps: int) -> None:
  f = fallback_threshold
  if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0.0 <= f <= 1.0:
    raise InputError(f"fallback_threshold must be in [0, 1], got {f!r}")
  r = rollback_threshold
  if not isinstance(r, (int, float)) or isinstance(r, bool) or math.isnan(r) or r <= 0:
    raise InputError(f"rollback_threshold must be > 0 (inf: never roll back), got {r!r}")
  requests.check_positive_int(max_small_steps, "max_small_steps", MAX_SMALL_STEPS,
                            "small-model tokens per large-model call")


def check_batch_policy(batch_policy: str) -> None:
  if batch_policy not in BATCH_POLICIES:
    raise InputError(f"batch_policy must be one of {BATCH_POLICIES}, got {batch_policy!r}")


def round_config(fallback_threshold: float, rollback_threshold: float, max_small_steps: int,
                 max_new_tokens: int, sampling=None, eos_id: int = 1,
                 batch_policy: str = "wait", small_kind: str = "model",
                 exact: bool | None = None) -> engine.RoundConfig:
  check_thresholds(fallback_threshold, rollback_threshold, max_small_steps)
  return engine.RoundConfig(
      call_width=engine.call_width(exact, sampling, int(max_small_steps) + 1),
      max_new_tokens=requests.check_positive_int(max_new_tokens, "max_new_tokens"),
      max_proposals=int(max_small_steps), sampling=sampling_lib.as_sampling(sampling),
      eos_id=eos_id, accept=Rollback(float(rollback_threshold)), verify=verify_unless_final,
      info=(("method", BiLD.name), ("fallback_threshold", float(fallback_threshold)),
            ("rollback_threshold", float(rollback_threshold)),
            ("max_small_steps", int(max_small_steps)), ("batch_policy", batch_policy),
            ("small", small_kind), ("lossy", lossy(fallback_threshold))))


def lossy(fallback_threshold: float) -> bool:
  """Whether BiLD's output may differ from the large model's: at fallback_threshold 1.0
  the small model is never confident enough (max p_S <= 1 always), every token is the
  large model's own, drawn from its distribution, so the run is exact."""
  return float(fallback_threshold) < 1.0


def proposer(small: Any, large: Model, fallback_threshold: float,
             batch_policy: str = "wait") -> DraftLoop:
  """The small model (a `Model`, a drafter, or `EarlyExitDrafter(large, k)`) under BiLD's
  fallback policy."""
  check_batch_policy(batch_policy)
  return DraftLoop(as_drafter(small, large), stop=Unsure(float(fallback_threshold)),
                   final_at_eos=True, stop_together=batch_policy == "sync", keep_q=False)


def early_exit(model: Model, exit_layer: int = 1) -> EarlyExitDrafter:
  """The small model of BiLD's early-exit variant: `model` read after `exit_layer` layers."""
  return EarlyExitDrafter(model, exit_layer)


@struct.dataclass
class BiLD(Method):
  """BiLD, the Big Little Decoder (Kim et al. 2023); the target is the large model. Lossy
  (`stats["lossy"]`), except at fallback_threshold=1.0: the large model's output, exactly.

  Attributes:
    small: a `Model` of the large one's kind with the same vocabulary, or
      `sd.early_exit(large, k)`.
    fallback_threshold: in [0, 1]; the small model hands over when max p_S <= it.
    rollback_threshold: > 0; roll back a small token y when -log p_L(y) > it (inf: never).
    max_small_steps: most consecutive small-model tokens before the large model runs.
    batch_policy: "wait" (each row as if alone) or "sync" (see `bild`).
    small_inputs: int [B, Le'] the small model's input if it differs.
    exact: large-model calls of `engine.EXACT_WIDTH` tokens: fallback_threshold=1.0 is
      then bitwise the large model's greedy output. None: for greedy decoding.

  Example::

      >>> import specdec_jax as sd, numpy as np
      >>> large = sd.load("config:t5_1_1_tiny")
      >>> out = sd.decode(large, sd.BiLD(sd.early_exit(large, 1), fallback_threshold=0.6),
      ...                 np.array([[5, 6, 7, 1]]), max_new_tokens=4)
      >>> bool(out.stats["lossy"])
      True
      >>> sd.BiLD(None, batch_policy="later")
      Traceback (most recent call last):
      ...
      specdec_jax.errors.InputError: batch_policy must be one of ('wait', 'sync'), got 'later'
  """

  name: ClassVar[str] = "bild"
  summary: ClassVar[str] = "BiLD: the small model (--drafter) writes, the target falls back"
  drafter_role: ClassVar[str | None] = "small model"
  statistics: ClassVar[tuple[str, ...]] = (*COMMON_STATS, "drafter_calls", *PROPOSED,
                                           "fallbacks", "fallback_rate", "rollback_rate")
  shorthand: ClassVar[tuple[str, ...]] = ("fallback_threshold", "rollback_threshold")

  small: Any = carried(flag="--drafter")
  fallback_threshold: float = setting(0.5, short="fb")
  rollback_threshold: float = setting(5.0, short="rb")
  max_small_steps: int = setting(10)
  batch_policy: str = setting(
      "wait", choices=BATCH_POLICIES,
      cli_help="wait: each row decodes as if alone; sync: the first row to hand over ends "
      "every row's drafting (fewer small calls)")
  small_inputs: Any = carried(per_call=True)
  exact: bool | None = setting(None)

  def __post_init__(self):
    check_thresholds(self.fallback_threshold, self.rollback_threshold, self.max_small_steps)
    check_batch_policy(self.batch_policy)
    check_exact(self.exact)

  def baseline(self) -> Method:
    """The large model alone (`Autoregressive`), greedy or sampled as this run."""
    return Autoregressive()

  def proposer(self, target, sampling):
    if self.small is None:
      raise InputError("sd.BiLD needs the small model: a Model with the large model's "
                       "vocabulary or sd.early_exit(large, k)")
    return proposer(self.small, target, self.fallback_threshold, self.batch_policy)

  def round_config(self, target, max_new_tokens, sampling, eos_id):
    return round_config(self.fallback_threshold, self.rollback_threshold,
                        self.max_small_steps, max_new_tokens, sampling, eos_id,
                        self.batch_policy, protocol.kind(as_drafter(self.small, target)),
                        self.exact)

  def proposer_inputs(self, proposer, inputs, max_new_tokens):
    return drafter_inputs(proposer, self.small_inputs, inputs, max_new_tokens)
