"""Blockwise parallel decoding (`sd.Blockwise`; Stern et al. 2018; Kim et al. 2024) on the
round engine.

    propose   HeadDrafter: heads 2..h on the verifier's last state (no drafter model)
    verify    ONE verifier call over [last, x_1..x_G]; it also yields the states the
              next round's heads read. With num_drafts = p > 1, the p best lattice paths
              go in ONE call as a tree (every draft attends to the shared prefix and to
              its own earlier tokens only) and the draft the acceptance rule keeps most
              of wins; its cache entries move to where a single draft would have put them.
    accept    acceptance.SpeculativeSampling: greedy, the longest prefix equal to the verifier's
              argmax (so the output is the verifier's greedy output, token for token);
              sampling, the exact rule with q from the heads (the target's distribution)
    commit    as every method

Statistics (beside the common ones): `repeated_draft_rate` (Kim et al.'s "% consec"),
`mean_max_run` ("max run"), and with `oracle=True` `oracle_tokens_per_target_call`,
the block efficiency of the best path through the top-k lattice in hindsight.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax import cache as cache_lib
from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import as_drafter
from specdec_jax.drafters.head_drafter import RESCORING, HeadDrafter
from specdec_jax.drafters.heads import Heads, check_heads, head_logits
from specdec_jax.errors import InputError
from specdec_jax.methods.autoregressive import Autoregressive
from specdec_jax.methods.base import (
  Method,
  carried,
  check_accept,
  check_exact,
  check_number,
  setting,
)
from specdec_jax.models.model import Model
from specdec_jax.rounds import engine, requests
from specdec_jax.rounds.acceptance import SpeculativeSampling, prefix_length
from specdec_jax.rounds.buffer import last_tokens
from specdec_jax.rounds.phases import AcceptRule, Proposal, Verified
from specdec_jax.rounds.stats import COMMON_STATS, PROPOSED, SCORED

Array = jax.Array

#: Upper bounds of the lattice's settings: generous, but each keeps a mistyped value a clear
#: error: the lattice keeps [B, heads, top_k] candidates and one verifier call holds
#: 1 + num_drafts * heads tokens.
MAX_LATTICE_K = 64
MAX_NUM_DRAFTS = 64


@dataclasses.dataclass(frozen=True)
class ParallelVerify:
  """Verify `num_drafts` drafts of `draft_length` tokens in ONE call shaped as a tree.

  The winner of each row is the draft with the most tokens kept by `accept`, the run's
  acceptance rule (first on ties): the rule that then commits the round is the rule that
  chose the draft. Each draft is scored with the round's acceptance key
  (`engine.round_keys`), so the engine's acceptance of the winner is the one computed here.
  """

  num_drafts: int
  draft_length: int
  accept: AcceptRule = SpeculativeSampling()
  sampling: sampling_lib.SamplingSettings = sampling_lib.Greedy()

  def layout(self, call_width: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets [K] from n, visible [K, K], views [p, G + 1]) of the call, K = 1 + pG.

    Token 0 is the last emitted token; token 1 + i*G + j is draft i's j-th token, at
    position n + 1 + j. views[i] are the call's positions whose logits score draft i.
    With `call_width` (exact mode) K = call_width: padding tokens nobody attends to.
    """
    p, g = self.num_drafts, self.draft_length
    pad = max(call_width - 1 - p * g, 0)
    draft = np.concatenate([[-1], np.repeat(np.arange(p), g), np.full(pad, -2)])
    step = np.concatenate([[-1], np.tile(np.arange(g), p), np.zeros(pad, int)])
    visible = (draft[None, :] == -1) | ((draft[:, None] == draft[None, :])
                                        & (step[None, :] <= step[:, None]) & (draft >= 0))
    views = np.array([[0] + [1 + i * g + j for j in range(g)] for i in range(p)])
    return step + 1, visible, views

  def __call__(self, target: Model, state: engine.RoundState, proposal: Proposal,
               call_width: int = 0) -> Verified:
    offsets, visible, views = self.layout(call_width)
    batch, p, g = state.n.shape[0], self.num_drafts, self.draft_length
    drafts = proposal.tokens.reshape(batch, p, g)
    tokens = jnp.concatenate([last_tokens(state.seq, state.n, 1), proposal.tokens], axis=1)
    tokens = jnp.pad(tokens, ((0, 0), (0, len(offsets) - tokens.shape[1])))   # exact mode
    logits, hidden, cache = target.decode_with_hidden(
        tokens, state.cache.with_length(state.n), positions=state.n[:, None] + offsets,
        visible=jnp.asarray(visible)[None])
    logits, hidden = logits[:, views], hidden[:, views]              # [B, p, G + 1, ...]
    q = None if proposal.q is None else proposal.q.reshape(batch, p, g, -1)
    key = engine.round_keys(state.rng)[2]

    def kept(draft_logits, draft_tokens, draft_q):                    # one draft -> m [B]
      one = proposal.replace(tokens=draft_tokens, q=draft_q)
      return self.accept(draft_logits, one, self.sampling, key).m

    m = jax.vmap(kept, in_axes=(1, 1, None if q is None else 1), out_axes=1)(
        logits, drafts, q)                                               # [B, p]
    win = jnp.argmax(m, axis=1)                                        # first most kept
    pick = lambda x: jnp.take_along_axis(x, win.reshape((-1,) + (1,) * (x.ndim - 1)), 1)[:, 0]
    src = state.n[:, None] + 1 + win[:, None] * g + jnp.arange(g)[None]
    cache = cache_lib.move(cache, src, state.n[:, None] + 1 + jnp.arange(g)[None])
    chosen = proposal.replace(tokens=pick(drafts), q=None if q is None else pick(q))
    return Verified(logits=pick(logits), hidden=pick(hidden), cache=cache,
                    ran=jnp.ones((), jnp.bool_), proposal=chosen)


def round_config(heads: Heads, max_new_tokens: int, sampling=None, eos_id: int = 1,
                 top_k: int = 1, num_drafts: int = 1, rescoring: str | None = None,
                 oracle: bool = False, accept: AcceptRule | None = None,
                 exact: bool | None = None
                 ) -> engine.RoundConfig:
  g = heads.num_drafts
  sampling = sampling_lib.as_sampling(sampling)
  rule = SpeculativeSampling() if accept is None else accept
  parallel = num_drafts > 1
  return engine.RoundConfig(
      call_width=engine.call_width(exact, sampling, 1 + num_drafts * g),
      max_new_tokens=requests.check_positive_int(max_new_tokens, "max_new_tokens"),
      max_proposals=g, sampling=sampling, eos_id=eos_id, accept=rule,
      verify=ParallelVerify(num_drafts, g, rule, sampling) if parallel else engine.verify,
      extra_capacity=(num_drafts - 1) * g,
      info=(("method", Blockwise.name), ("num_heads", heads.num_heads), ("top_k", top_k),
            ("num_drafts", num_drafts), ("rescoring", rescoring),
            ("oracle_top_k", top_k if oracle else 0), ("lossy", False)))


def check_rescoring(rescoring: str | None, rescorer: Any, num_drafts: int) -> None:
  if rescoring not in RESCORING:
    raise InputError(f"rescoring must be one of {RESCORING}, got {rescoring!r}")
  if rescoring is not None and rescorer is None:
    raise InputError(f"rescoring={rescoring!r} needs a rescorer (an n-gram LM or a model)")
  if rescoring is None and rescorer is not None:
    raise InputError("a rescorer needs rescoring='ngram' or 'neural'")
  if rescoring == "neural" and num_drafts > 1:
    raise InputError("neural rescoring builds one draft: use num_drafts=1")


def check_settings(model: Model, heads: Heads, top_k: int, num_drafts: int,
                   rescoring: str | None, rescorer: Any, sampling) -> None:
  requests.check_positive_int(num_drafts, "num_drafts")
  requests.check_positive_int(top_k, "top_k")
  if top_k > model.config.vocab_size:
    raise InputError(f"top_k={top_k} exceeds the vocabulary size {model.config.vocab_size}")
  if num_drafts > top_k ** heads.num_drafts:
    enough = next(k for k in range(top_k + 1, num_drafts + 1)
                  if k ** heads.num_drafts >= num_drafts)
    raise InputError(f"num_drafts={num_drafts} exceeds the {top_k}^{heads.num_drafts} paths "
                     f"of the top-{top_k} lattice ({heads.num_drafts} drafted tokens, "
                     f"top_k={top_k} candidates each): raise top_k (top_k={enough} gives "
                     f"{enough ** heads.num_drafts} paths) or lower num_drafts")
  check_rescoring(rescoring, rescorer, num_drafts)
  if not sampling.is_greedy and (num_drafts > 1 or rescoring is not None or top_k > 1):
    raise InputError("sampling with head drafts draws from the heads' distributions: "
                     "use top_k=1, num_drafts=1 and no rescoring")
  check_heads(model, heads)


def output_states(model: Model, inputs: Array, tokens: Array,
                  prompt_lengths: Array | None = None) -> Array:
  """Teacher-forced final states [B, T, E] that predicted each output token tokens [B, T].

  T5: the decoder over [start, tokens[:-1]] reading the encoder `inputs`. Decoder-only: one
  causal pass over each row's prompt (`inputs` [B, P], right-padded, `prompt_lengths`)
  followed by its tokens, read from the prompt's last token on.
  """
  if not model.is_decoder_only:
    dec_in = jnp.concatenate([jnp.zeros_like(tokens[:, :1]), tokens[:, :-1]], axis=1)
    return model.hidden_states(inputs, dec_in)
  if prompt_lengths is None:
    raise InputError("output_states: a decoder-only model needs its prompts' prompt_lengths")
  batch, length = tokens.shape
  cols = prompt_lengths[:, None] + jnp.arange(length)[None]                   # [B, T]
  full = jnp.pad(inputs, ((0, 0), (0, length)), constant_values=model.config.pad_id)
  full = full.at[jnp.arange(batch)[:, None], cols].set(tokens)
  states = model.hidden_states(full)                                          # [B, P + T, E]
  return jnp.take_along_axis(states, (cols - 1)[..., None], axis=1)


@functools.partial(jax.jit, static_argnames=("top_k",))
def oracle_calls(model: Model, heads: Heads, inputs: Array, tokens: Array,
                 lengths: Array, top_k: int, prompt_lengths: Array | None = None) -> Array:
  """[B] target calls an oracle drafting from the top-k lattice needs for the same output.

  The oracle decodes the same output: the first round has no heads' state (1 token);
  then, with the last emitted token at index i, head j+2 at state i-1 may propose token
  i+j; it accepts the longest prefix inside the heads' top-k sets, plus one target token.
  One teacher-forced pass gives every state; the walk is a loop on device.
  `prompt_lengths`: a decoder-only model's (`inputs` are then its prompts).
  """
  states = output_states(model, inputs, tokens, prompt_lengths)
  logits = head_logits(model, heads, states)                                   # [B,T,G,V]
  batch, length, g = logits.shape[:3]
  ahead = jnp.arange(length)[:, None] + jnp.arange(g)[None, :] + 1                # [T, G]
  target = jnp.take_along_axis(jnp.pad(tokens, ((0, 0), (0, g + 1))),
                               ahead.reshape(1, -1), axis=1).reshape(batch, length, g)
  chosen = jnp.take_along_axis(logits, target[..., None], axis=-1)[..., 0]
  in_top = chosen >= sampling_lib.top_k(logits, top_k)[0][..., -1]                 # [B, T, G]

  def walk(_, carry):
    i, calls = carry              # i tokens emitted after `calls` target calls
    row = jnp.take_along_axis(in_top, jnp.maximum(i - 1, 0)[:, None, None], axis=1)[:, 0]
    run = prefix_length(row & (jnp.arange(g)[None] < (lengths - i)[:, None]))
    live = i < lengths
    return jnp.where(live, i + run + 1, i), calls + live

  ones = jnp.ones((batch,), jnp.int32)
  return jax.lax.fori_loop(0, length, walk, (ones, ones))[1]


@struct.dataclass
class Blockwise(Method):
  """Blockwise parallel decoding (Stern et al. 2018; Kim et al. 2024): prediction heads on
  the target draft, the target verifies. Greedy output is the target's.

  Attributes:
    heads: `sd.Heads` for the target (`sd.init_heads`, `sd.load_heads`).
    top_k: candidates per head in the lattice (1: each head's argmax).
    num_drafts: the p best lattice paths verified together in one call (parallel BPD).
    rescoring: None, "ngram" (rescorer: `lattice.NGramLM`) or "neural" (rescorer: a small
      `Model` with the same vocabulary).
    rescorer: the n-gram LM or model of `rescoring`.
    rescoring_weight: the weight of the rescorer's log-probs against the heads'.
    oracle: also count the oracle top-k block efficiency (one teacher-forced pass).
    accept: another acceptance rule (research, an `sd.AcceptRule`); it also picks the
      winning draft when `num_drafts > 1`. None: `acceptance.SpeculativeSampling()`.
    exact: verifier calls of `engine.EXACT_WIDTH` tokens. None: greedy, if it fits.

  Example::

      >>> import specdec_jax as sd, numpy as np
      >>> model = sd.load("config:t5_1_1_tiny")
      >>> heads = sd.init_heads(model, 3)
      >>> out = sd.decode(model, sd.Blockwise(heads), np.array([[5, 6, 7, 1]]),
      ...                 max_new_tokens=4)
      >>> out.lengths.shape
      (1,)
  """

  name: ClassVar[str] = "blockwise"
  summary: ClassVar[str] = "blockwise parallel decoding: prediction heads draft"
  statistics: ClassVar[tuple[str, ...]] = (*COMMON_STATS, *PROPOSED, *SCORED,
                                           "repeated_draft_rate", "mean_max_run",
                                           "oracle_tokens_per_target_call")
  shorthand: ClassVar[tuple[str, ...]] = ("top_k", "num_drafts")
  # with --heads the bench times it plain; the flag adds lattices
  bench_flag: ClassVar[str | None] = "--heads-lattice"

  heads: Any = carried(flag="--heads")
  top_k: int = setting(1, flag="--lattice-k", short="k")
  num_drafts: int = setting(1, short="p")
  rescoring: str | None = setting(
      None, choices=RESCORING,
      cli_help="rescore the lattice's paths with a bigram LM (ngram) or a small model "
      "(neural), given by --rescorer")
  rescorer: Any = carried(flag="--rescorer")
  rescoring_weight: float = setting(1.0)
  oracle: bool = setting(False)
  accept: AcceptRule | None = setting(None, research=True)
  exact: bool | None = setting(None)

  def __post_init__(self):
    requests.check_positive_int(self.top_k, "top_k", MAX_LATTICE_K, "lattice candidates per head")
    requests.check_positive_int(self.num_drafts, "num_drafts", MAX_NUM_DRAFTS,
                              "drafts verified together in one target call")
    check_rescoring(self.rescoring, self.rescorer, self.num_drafts)
    check_number(self.rescoring_weight, "rescoring_weight")
    if not isinstance(self.oracle, bool):
      raise InputError(f"oracle must be True or False, got {self.oracle!r}")
    check_accept(self.accept)
    check_exact(self.exact)

  def baseline(self) -> Method:
    """The target alone (`Autoregressive`), greedy or sampled as this run."""
    return Autoregressive()

  def proposer(self, target, sampling):
    requests.check_heads_value(self.heads)
    if not isinstance(self.heads, Heads):
      raise InputError(f"sd.Blockwise needs the target's prediction heads (sd.Heads from "
                       f"sd.init_heads / sd.load_heads), got {type(self.heads).__name__}")
    check_settings(target, self.heads, self.top_k, self.num_drafts, self.rescoring,
                   self.rescorer, sampling)
    neural = as_drafter(self.rescorer, target) if self.rescoring == "neural" else None
    return HeadDrafter(target, self.heads, lm=self.rescorer if self.rescoring == "ngram"
                       else None, rescorer=neural, top_k=self.top_k,
                       num_drafts=self.num_drafts, rescoring=self.rescoring,
                       weight=float(self.rescoring_weight))

  def round_config(self, target, max_new_tokens, sampling, eos_id):
    return round_config(self.heads, max_new_tokens, sampling, eos_id, self.top_k,
                        self.num_drafts, self.rescoring, self.oracle, self.accept, self.exact)

  def finish(self, target, inputs, out, prompt_lengths=None):
    if not self.oracle:
      return out
    calls = oracle_calls(target, self.heads, inputs, out.tokens, out.lengths, self.top_k,
                         prompt_lengths)
    return out.replace(counters=out.counters.replace(oracle_calls=calls))
