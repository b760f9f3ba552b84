"""Exact speculative beam search (`experimental.SpeculativeBeam`): `sd.Beam`'s beams with
a drafter.

    from specdec_jax import experimental
    out = sd.decode(target, experimental.SpeculativeBeam(drafter, num_beams=4, alpha=0.6,
                                                         gamma=3), inputs, max_new_tokens=T)

returns what `sd.Beam(num_beams=4, alpha=0.6)` returns (`beam.BeamOutput`: the best beam,
every beam, T5X's scores and order, the lengths), bitwise, whatever the drafter proposes;
only the number of target calls depends on it. (Bitwise where the target's k-token call
rounds like its 1-token call: a width-invariant target, `Model.width_invariant_decode`,
or `exact=True` on both sides, whose calls all carry `engine.EXACT_WIDTH` tokens.)

A round, for the K live beams of every row (the flat [B*K] layout of `beam`), is four
phases over one `State`, as the round engine's (`init`, then `round_step` while `cond`,
then `finish`; `_run` is that loop under `jax.jit`):

    draft    (`draft` -> `Tree`) the drafter's own beam search (width K, from the live
             beams and their log-probs) for gamma steps: a tree of K nodes per level
             (the first level: `width`, default 2K; the deeper ones K, or `run`'s
             deep_width); where the last round computed a beam's target logits, the
             first level reads them. The tree is cut into M chains (`chains`, default
             3K) following first children: chain k continues live beam k, the others
             start at the other children, shallowest first (the replay needs every
             node of a level)
    verify   (`verify` -> `Scores`) ONE target call over B*M rows [beam's last token,
             c_1 .. c_gamma] (each chain's beam's cache gathered to its row): logits at
             gamma + 1 positions, every position at the slot a one-token step would
             write it to
    replay   (`replay` -> `Replayed`) T5X's `beam.step` with those log-probs, while every
             new live beam of the row is a scored node (a chain that shares its parent's
             prefix has its token next: its logits are in the call); the first step
             whose new beams leave the chains ends the row's round. Step 1 always
             replays (chain k starts with beam k).
    commit   (`commit` -> `State`) each new beam's cache is its parent's chain row (a
             gather within the row's block), whose positions up to the beam's last token
             the call wrote; the length says where it ends

Why the replay is T5X's beam search: each replayed step is `beam.step` itself, given the
target's logits for exactly the sequences T5X would feed, computed at the same slots over
the same cache entries (a chain's token at depth d sits at slot t + d, after its parent's),
so the log-probs, the top-k choices and the ties are T5X's. (M > K rows need a target
whose decode is batch-invariant as well, as the width-invariant kernels are; exact mode
on another target keeps K rows, `sd.Beam`'s call shape.)

Rows run ahead of one another (each row's `cur_index` is its own): T5X's loop is one
`lax.while_loop` over every row, and its stopping rule (`beam.cond`) reads all rows at one
step. A row takes step s + 1 only once that rule is KNOWN to go on at step s: from the
rows that have been at step s (each row records its `beam.row_flags` at every step it
reaches), some row not settled and some row not hopeless. The lowest row always knows
(every row is at or past it), so the loop never stalls, no row passes the step at which
T5X stops, and every row ends there, with the state T5X's loop leaves it in.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, Sequence

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax import sampling as sampling_lib
from specdec_jax.cache import DecoderCache
from specdec_jax.drafters import as_drafter
from specdec_jax.errors import InputError
from specdec_jax.methods import beam
from specdec_jax.methods.base import Method, carried, check_exact, check_number, setting
from specdec_jax.methods.speculative import MAX_GAMMA
from specdec_jax.models.model import Model
from specdec_jax.rounds import engine, requests
from specdec_jax.rounds.stats import OWN_LOOP_STATS, DecodeStats, summarize

Array = jax.Array


@struct.dataclass
class SpeculativeBeamOutput(beam.BeamOutput):
  """`beam.BeamOutput` plus the steps taken (`stats` reads them).

  Attributes:
    steps: int32 [] beam steps taken (T5X's final `cur_index`).
  """

  steps: Array | None = None

  @functools.cached_property
  def stats(self):
    """The readable statistics: the common ones (`stats.summarize`), then

      steps                   beam steps taken (T5X's loop iterations; `sd.Beam`'s calls)
      steps_per_target_call   float, steps / rounds: beam steps per target call
      drafter_calls           drafter calls counted per row (gamma per round)
      drafted                 drafted nodes counted per row: the tree's, width + K (gamma - 1)
                              a round
      drafted_nodes_per_round float, drafted / target_calls
      accepted                drafted nodes whose target logits took a beam step
      acceptance_rate         float, accepted / drafted
      per_position_accepted   list [gamma]: (row, round) pairs whose beams took a step from
                              the drafted nodes at depth d + 1
      acceptance_by_depth     list [gamma] of floats: per_position_accepted / target_calls

    plus the run's `info`. Several outputs (a corpus's batches) merge exactly
    (`stats.merge_outputs`, `derive_stats`): ratios of totals, never means of ratios."""
    return self.derive_stats(summarize(self.counters, dict(self.info),
                                       statistics=SpeculativeBeam.statistics), [self])

  @staticmethod
  def derive_stats(summary: dict[str, Any], outputs: Sequence[Any]) -> dict[str, Any]:
    """`summary` (of the outputs' merged counters) with the statistics above that are not
    counters: steps summed over the outputs (each one call's), over the rounds summed."""
    info = dict(outputs[0].info)
    out = {k: v for k, v in summary.items() if k not in info}
    steps, calls = sum(int(o.steps) for o in outputs), max(out["target_calls"], 1)
    out["steps"] = steps
    out["steps_per_target_call"] = steps / max(out["rounds"], 1)
    out["drafted_nodes_per_round"] = out["drafted"] / calls
    out["acceptance_by_depth"] = [v / calls for v in out["per_position_accepted"]]
    out.update({k: summary[k] for k in info if k in summary})
    return out


@struct.dataclass
class SpeculativeBeam(Method):
  """Exact speculative beam search: `sd.Beam`'s output (T5X's `beam_search`), with fewer
  target calls when a drafter predicts the beams' continuations.

  Attributes:
    drafter: a `Model` of the target's kind and vocabulary, or a token-level drafter of
      `specdec_jax.drafters` (`sd.NGramDrafter`, `sd.PromptLookupDrafter`).
    num_beams: K, beams per row (>= 1).
    alpha: the brevity penalty's exponent, as `sd.Beam`'s (T5X's default 0.6).
    gamma: drafted tokens per beam and round: a round takes 1 to gamma + 1 beam steps.
    width: the drafted tree's first level: the drafter's best `width` (>= num_beams)
      continuations of the live beams (its search goes on from the best num_beams).
      None: 2 * num_beams.
    chains: M, the drafted chains verified per row and round (>= num_beams; one target
      call of M rows per row). None: 3 * num_beams, or num_beams in exact mode on a
      target whose decode is not width-invariant (there the call keeps `sd.Beam`'s rows).
    min_log_prob: stop once no live beam's log-prob (over the largest penalty) passes it.
    exact: every target call of `engine.EXACT_WIDTH` tokens, as `sd.Beam(exact=True)`'s,
      so its beams are bitwise those on any backend; None: False (bitwise `sd.Beam()`'s
      where the target's decode is width-invariant, `Model.width_invariant_decode`).

  Example (a random drafter: the beams are the target's all the same)::

      >>> import specdec_jax as sd, numpy as np
      >>> from specdec_jax import experimental
      >>> target = sd.load("config:t5_1_1_tiny")
      >>> drafter = sd.init_model(sd.get_config("t5_1_1_tiny"), 5)
      >>> enc = np.array([[5, 6, 7, 1]])
      >>> out = sd.decode(target, experimental.SpeculativeBeam(drafter, num_beams=2), enc,
      ...                 max_new_tokens=4)
      >>> ref = sd.decode(target, sd.Beam(num_beams=2), enc, max_new_tokens=4)
      >>> bool((out.beams == ref.beams).all())
      True
  """

  name: ClassVar[str] = "speculative-beam"
  summary: ClassVar[str] = ("exact speculative beam search: --drafter proposes, T5X's beam "
                            "search replayed on the target's scores (greedy only)")
  drafter_role: ClassVar[str | None] = "drafter"
  greedy_only: ClassVar[bool] = True
  with_drafter_for: ClassVar[str | None] = beam.Beam.name
  # beam search's own (a step is one call over K beams: no tokens per call, no
  # log-prob of one emitted sequence), then the drafter's
  statistics: ClassVar[tuple[str, ...]] = (*OWN_LOOP_STATS, "drafter_calls", "drafted",
                                           "accepted", "acceptance_rate",
                                           "per_position_accepted")
  # what `SpeculativeBeamOutput.stats` derives beside them
  derived_statistics: ClassVar[tuple[str, ...]] = ("steps", "steps_per_target_call",
                                                   "drafted_nodes_per_round",
                                                   "acceptance_by_depth")
  shorthand: ClassVar[tuple[str, ...]] = ("num_beams", "gamma")

  drafter: Any = carried(flag="--drafter")
  num_beams: int = setting(4, short="K")
  alpha: float = setting(0.6)
  gamma: int = setting(3)
  width: int | None = setting(
      None, flag="--beam-width",
      cli_help="the drafted tree's first level: the drafter's best continuations of the live "
      "beams, at least --num-beams (default: 2 x --num-beams)")
  chains: int | None = setting(
      None, flag="--beam-chains",
      cli_help="drafted chains verified per row and round in one target call, at least "
      "--num-beams (default: 3 x --num-beams; --num-beams in exact mode off the kernels)")
  min_log_prob: float = setting(beam.NEG_INF)
  exact: bool | None = setting(None)

  def baseline(self) -> Method:
    """`sd.Beam` of the same beams, penalty and `exact`: its beams and scores are this
    one's (bitwise on a width-invariant target, or in exact mode on both sides)."""
    return beam.Beam(num_beams=self.num_beams, alpha=self.alpha,
                     min_log_prob=self.min_log_prob, exact=self.exact)

  def __post_init__(self):
    requests.check_positive_int(self.num_beams, "num_beams", beam.MAX_BEAMS,
                              "beams per row: the model runs over batch x num_beams rows")
    requests.check_positive_int(self.gamma, "gamma", MAX_GAMMA,
                              "drafted tokens per beam and round")
    if check_number(self.alpha, "alpha") < 0:
      raise InputError(f"alpha (the brevity penalty's exponent) must be >= 0, got {self.alpha!r}")
    check_number(self.min_log_prob, "min_log_prob")
    check_exact(self.exact)
    if self.width is not None and requests.check_positive_int(self.width, "width") \
        < self.num_beams:
      raise InputError(f"width must be >= num_beams ({self.num_beams}): the search goes on "
                       f"from the best num_beams, got {self.width!r}")
    if self.chains is not None and requests.check_positive_int(self.chains, "chains") \
        < self.num_beams:
      raise InputError(f"chains must be >= num_beams ({self.num_beams}): every beam needs "
                       f"a chain, got {self.chains!r}")
    if self.exact and self.gamma + 1 > engine.EXACT_WIDTH:
      raise InputError(f"exact mode verifies at most {engine.EXACT_WIDTH - 1} drafted tokens "
                       f"per beam, got gamma={self.gamma} (use exact=False)")

  def search(self, max_new_tokens: int, sampling: Any = None, eos_id: int = 1) -> "Search":
    """The static settings of its program for `max_new_tokens` (`Search`; its `resolve`
    fills in the defaults for a target). sampling: greedy only (None: greedy)."""
    config = beam.search_config(self, max_new_tokens, sampling_lib.as_sampling(sampling),
                                eos_id)
    return Search(config=config, gamma=self.gamma, width=self.width, chains=self.chains,
                  exact=bool(self.exact))

  def program(self, target, inputs, max_new_tokens, sampling, rng, eos_id,
              prompt_lengths) -> engine.Program:
    if self.drafter is None:
      raise InputError("experimental.SpeculativeBeam needs a drafter: a Model with the "
                       "target's vocabulary or a drafter of specdec_jax.drafters")
    return _program(target, self.drafter, inputs, prompt_lengths,
                    self.search(max_new_tokens, sampling, eos_id))

  def run(self, target, inputs, max_new_tokens, sampling, rng, eos_id,
          prompt_lengths):
    return self.program(target, inputs, max_new_tokens, sampling, rng, eos_id,
                        prompt_lengths)()


# ----------------------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class Search:
  """The static settings of one speculative beam search (hashable: `program`'s jitted
  function takes them as one static argument).

  Attributes:
    config: T5X's settings of the search (`beam.SearchConfig`: K, alpha, EOS, lengths).
    gamma: G, drafted tokens per beam and round.
    width: the tree's first level, >= K (None: 2K).
    chains: M, the chains verified per row and round, >= K (None: 3K, or K where the
      call is padded).
    exact: every target call of `engine.EXACT_WIDTH` tokens (`sd.Beam(exact=True)`'s).
    deep_width: each deeper level, >= K (None: K): a research knob (`program`).
    check_scored: False is a deliberately WRONG replay, a negative control (`program`).
    padded: set by `resolve`: the verify call is padded to `engine.EXACT_WIDTH` tokens
      (exact mode on a target whose decode is not width-invariant).
  """

  config: beam.SearchConfig
  gamma: int
  width: int | None = None
  chains: int | None = None
  exact: bool = False
  deep_width: int | None = None
  check_scored: bool = True
  padded: bool = False

  def resolve(self, target: Model, prompt_width: int) -> "Search":
    """These settings with every None filled in and checked for `target`; a decoder-only
    target's penalty bound counts its prompt slots (prompt_width P: inputs [B, P])."""
    k = self.config.num_beams
    padded = self.exact and not target.width_invariant_decode
    deep_width = k if self.deep_width is None else self.deep_width
    if requests.check_positive_int(deep_width, "deep_width") < k:
      raise InputError(f"deep_width must be >= num_beams ({k}): the search goes on from the "
                       f"best num_beams, got {deep_width!r}")
    chains = (k if padded else 3 * k) if self.chains is None else self.chains
    if padded and chains != k:
      raise InputError(f"exact mode on a target whose decode is not width-invariant verifies "
                       f"one chain per beam (its calls keep sd.Beam's {k} rows per row): "
                       f"chains={chains} (use chains=None, or pack the target: sd.pack)")
    config = self.config
    if target.is_decoder_only:
      config = dataclasses.replace(config, penalty_len=prompt_width + config.max_decode_len)
    return dataclasses.replace(self, config=config, padded=padded, chains=chains,
                               width=2 * k if self.width is None else self.width,
                               deep_width=deep_width)

  @property
  def call_width(self) -> int:
    """Tokens per verify call: G + 1, or `engine.EXACT_WIDTH` when padded."""
    return engine.EXACT_WIDTH if self.padded else self.gamma + 1

  @property
  def sizes(self) -> list[int]:
    """Nodes per level of the drafted tree, [K, width, deep_width, ...] (G + 1 levels)."""
    width, deep = self._resolved("width"), self._resolved("deep_width")
    return [self.config.num_beams] + [width if depth == 1 else deep
                                      for depth in range(1, self.gamma + 1)]

  @property
  def num_chains(self) -> int:
    """M, the chains verified per row and round."""
    return self._resolved("chains")

  def _resolved(self, name: str) -> int:
    value = getattr(self, name)
    if value is None:
      raise InputError(f"Search.{name} is None: call resolve(target, prompt_width) first")
    return value


# ----------------------------------------------------------------------------- entry points


def run(target: Model, drafter: Any, inputs: Array, *, prompt_lengths: Array | None = None,
        **settings) -> SpeculativeBeamOutput:
  """`program(...)()`: see there."""
  return program(target, drafter, inputs, prompt_lengths=prompt_lengths, **settings)()


def program(target: Model, drafter: Any, inputs: Array, *,
            prompt_lengths: Array | None = None, **settings) -> engine.Program:
  """Speculative beam search of `target` over `inputs` [B, Le] (a decoder-only target:
  prompts [B, P] with `prompt_lengths` [B]) as ONE jitted program, whose output is
  `beam.run(target, inputs, config=config, exact=exact, ...)`'s: the call (`engine.Program`)
  that `run` makes and `sd.lower` lowers.

  settings: the fields of `Search` by keyword (config and gamma required; width, chains,
  exact, deep_width, check_scored).

  deep_width: the tree's levels below the first, each the drafter's best `deep_width`
  (>= K) continuations of the level above's best K (None: K). The extra nodes are leaves
  (the drafter goes on from the best K) that more chains can cover, so that a step's new
  beams are more often all scored. Measured on the demo pair (batch 1, 8 sentences,
  deep_width 8): s 1.60 -> 1.66 (gamma 2, M 12 -> 16), 1.75 (gamma 3, M 16; or gamma 2,
  width 16, M 20); the wider call costs more than those steps gain (the lab's results,
  packages/specdec-jax-lab/results/speculative_beam/), so it is a research knob of `run`,
  not a setting of `SpeculativeBeam`.

  check_scored=False is a deliberately WRONG replay (a negative control for the tests):
  it takes gamma + 1 steps every round, reading each new beam's logits from its parent's
  chain whether or not the beam is the chain's node.
  """
  return _program(target, drafter, inputs, prompt_lengths, Search(**settings))


def _program(target: Model, drafter: Any, inputs: Array, prompt_lengths: Array | None,
             search: Search) -> engine.Program:
  drafter = as_drafter(drafter, target)
  if getattr(drafter, "shares_target_cache", False):
    raise InputError("SpeculativeBeam drafts in a cache of its own: an early exit of "
                     "the target (sd.early_exit) is not supported; pass a model")
  search = search.resolve(target, inputs.shape[1])
  return engine.Program(_run, (target, drafter, inputs, prompt_lengths), {"search": search})


@functools.partial(jax.jit, static_argnames=("search",))
def _run(target: Model, drafter: Any, inputs: Array, prompt_lengths: Array | None, *,
         search: Search) -> SpeculativeBeamOutput:
  state, context = init(target, drafter, inputs, prompt_lengths, search)
  state = jax.lax.while_loop(functools.partial(cond, search=search),
                             lambda s: round_step(target, drafter, s, context, search), state)
  return finish(state, search, drafter.kind)


# ----------------------------------------------------------------------------- state


class State(struct.PyTreeNode):
  """The loop's state between rounds.

  Attributes:
    beam: `beam.BeamState` with a per-row `cur_index` [B]; its cache the target's [B*K].
    drafter: the drafter's state over the flat [B*K] beams.
    settled, hopeless: bool [B, L] each row's `beam.row_flags` at every step it reached.
    depth_used: int32 [B, G] rounds in which the row took a step from depth d + 1.
    rounds: int32 [] target calls.
    known: bool [B, K] live beams whose target logits the last round computed.
    logits: f32 [B, K, V] those logits (the drafter's first level reads them).
  """

  beam: beam.BeamState
  drafter: Any
  settled: Array
  hopeless: Array
  depth_used: Array
  rounds: Array
  known: Array
  logits: Array


class Context(struct.PyTreeNode):
  """What every round reads and none changes.

  Attributes:
    chain_cross: the target's cross-attention K/V at the chains' [B*M] rows (None: a
      decoder-only target): the same for a row's beams and chains, so built once.
    initial_index: int32 [B] a decoder-only target's prompt lengths (None: T5).
  """

  chain_cross: Any
  initial_index: Array | None


class Tree(struct.PyTreeNode):
  """The drafted chains of one round, M per row (`draft`).

  Attributes:
    root: int32 [B, M] the live beam each chain continues.
    path: int32 [B, M, G] its tokens (0 past its drafted node's depth).
    level, node: int32 [B, M] where its drafter state is: snapshot `level`, beam `node`.
    snapshots: the drafter's states after feeding levels 0 .. G-1, stacked [G, B*K, ...].
  """

  root: Array
  path: Array
  level: Array
  node: Array
  snapshots: Any


class Scores(struct.PyTreeNode):
  """The verify call's results (`verify`).

  Attributes:
    logits: f32 [B, M, G + 1, V] each chain's next-token logits after its beam's last
      token and after each of its tokens.
    cache: the target's cache over the chains' [B*M] rows after the call.
  """

  logits: Array
  cache: Any


class Replayed(struct.PyTreeNode):
  """The replay's state, and its result (`replay`).

  Attributes:
    beam: the beams after the steps taken; its `cache` int32 [B, K]: the chain each beam
      is on (-1: none, the beam's next logits are not in this call).
    parents: int32 [B, K] the chain of each beam's parent (its cache row).
    depth: int32 [B] beam steps taken this round.
    scored: bool [B] every new beam of the row is a scored node.
    settled, hopeless, depth_used: as `State`'s.
  """

  beam: beam.BeamState
  parents: Array
  depth: Array
  scored: Array
  settled: Array
  hopeless: Array
  depth_used: Array


# ----------------------------------------------------------------------------- phases


def init(target: Model, drafter: Any, inputs: Array, prompt_lengths: Array | None,
         search: Search) -> tuple[State, Context]:
  """The state before the first round: the target's and the drafter's caches started
  (one capacity, one call width: `beam`'s), repeated over the K beams of each row."""
  config, k = search.config, search.config.num_beams
  batch, steps = inputs.shape[0], config.max_decode_len - 1
  rounds = engine.RoundConfig(max_new_tokens=steps, max_proposals=0,
                              call_width=engine.EXACT_WIDTH if search.exact else 0)
  drafting = engine.RoundConfig(max_new_tokens=steps, max_proposals=search.gamma)
  initial_index = None
  if target.is_decoder_only:
    prompt = inputs.shape[1]
    cache = target.start(inputs, engine.cache_capacity(target, rounds, prompt),
                         prompt_lengths).anchored()
    initial_index = prompt_lengths
    dstate = drafter.init(inputs, drafting.capacity + prompt, lengths=prompt_lengths)
  else:
    cache = target.start(inputs, rounds.capacity)
    dstate = drafter.init(inputs, drafting.capacity)
  repeat = lambda tree, n: jax.tree_util.tree_map(lambda x: jnp.repeat(x, n, axis=0), tree)
  # The cross-attention K/V is the same for a row's beams and chains: built once at the
  # chains' [B*M] rows for the verify calls (not gathered from the beams' every round) and
  # not carried at [B*K] (no target call runs on the beams' rows).
  chain_cross = None if cache.cross is None else repeat(cache.cross, search.num_chains)
  cache, dstate = repeat(cache.replace(cross=None), k), repeat(dstate, k)   # [B*K, ...]
  first = target.first_tokens(inputs, prompt_lengths)
  seqs = jnp.zeros((batch, k, steps + 1), jnp.int32).at[:, :, 0].set(first[:, None])
  start = beam.init_state(seqs, cache, k)
  start = start.replace(cur_index=jnp.zeros((batch,), jnp.int32))
  settled, hopeless = beam.row_flags(start, config)
  no = jnp.zeros((batch, steps + 1), jnp.bool_)
  state = State(beam=start, drafter=dstate, settled=no.at[:, 0].set(settled),
                hopeless=no.at[:, 0].set(hopeless),
                depth_used=jnp.zeros((batch, search.gamma), jnp.int32),
                rounds=jnp.zeros((), jnp.int32), known=jnp.zeros((batch, k), jnp.bool_),
                logits=jnp.zeros((batch, k, target.config.vocab_size), jnp.float32))
  return state, Context(chain_cross=chain_cross, initial_index=initial_index)


def cond(state: State, search: Search) -> Array:
  """Go on? Some row may take its next step (`_go`: T5X's stopping rule, as known)."""
  return jnp.any(_go(state.beam.cur_index, state.settled, state.hopeless, search.config))


def round_step(target: Model, drafter: Any, state: State, context: Context,
               search: Search) -> State:
  """One round: draft, verify, replay, commit."""
  tree = draft(drafter, state, search)
  scores = verify(target, state, tree, context, search)
  return commit(state, tree, scores, replay(state, tree, scores, context, search))


def draft(drafter: Any, state: State, search: Search) -> Tree:
  """The drafter's own beam search (width K, EOS excluded: T5X's live beams) for gamma
  steps from the K live beams; its nodes form a tree under the beams, `width` >= K of
  them at the first level and `deep_width` >= K at each deeper one (the search goes on
  from the best K). Where the target's next-token logits of a live beam are known (the
  last round scored the beam), the first level reads them instead of the drafter's.

  A chain follows first children down; one starts at each live beam (step 1 needs every
  beam's logits: chain k is beam k's), then at each other child, shallowest first, up to
  `chains` per row: the replay needs every node of a level, so the tree is covered level
  by level."""
  parents, tokens, snapshots = _drafter_search(drafter, state, search)
  return _chains(parents, tokens, snapshots, search)


def verify(target: Model, state: State, tree: Tree, context: Context,
           search: Search) -> Scores:
  """ONE target call over B*M rows [beam's last token, c_1 .. c_G] (padded to
  `search.call_width`), each chain's row a copy of its beam's cache: logits at G + 1
  positions, each at the slot a one-token step would write it to."""
  b = state.beam
  batch, k = b.live_logprobs.shape
  gamma, m = search.gamma, search.num_chains
  flat = b.live_seqs.reshape(batch * k, -1)
  n = jnp.repeat(b.cur_index, k)
  last = jnp.take_along_axis(flat, n[:, None], axis=1).reshape(batch, k)
  tokens = jnp.concatenate([_take(last, tree.root)[..., None], tree.path], axis=2)
  tokens = jnp.pad(tokens.reshape(batch * m, gamma + 1),
                   ((0, 0), (0, search.call_width - gamma - 1)))
  # Each chain continues its beam's cache: M rows per row, [B*K] -> [B*M].
  rows = jax.tree_util.tree_map(lambda x: _blocks(x, tree.root), b.cache)
  logits, cache = target.decode(tokens, rows.replace(cross=context.chain_cross))
  logits = logits[:, :gamma + 1].astype(jnp.float32).reshape(batch, m, gamma + 1, -1)
  return Scores(logits=logits, cache=cache)


def replay(state: State, tree: Tree, scores: Scores, context: Context,
           search: Search) -> Replayed:
  """T5X's `beam.step` on the verified log-probs, per row, while every new live beam of
  the row is a scored node (a chain that shares its parent's prefix has its token next:
  its logits are in the call); the first step whose new beams leave the chains ends the
  row's round. Step 1 always replays (chain k starts with beam k)."""
  b = state.beam
  batch, k = b.live_logprobs.shape
  identity = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (batch, k))
  # same[b, i, j, d]: chains i and j share their beam and first d tokens.
  equal = jnp.cumprod(tree.path[:, :, None] == tree.path[:, None], axis=3).astype(bool)
  same = jnp.concatenate([jnp.ones(equal.shape[:3] + (1,), jnp.bool_), equal], axis=3)
  same = same & (tree.root[:, :, None] == tree.root[:, None, :])[..., None]
  start = Replayed(beam=b.replace(cache=identity), parents=identity,
                   depth=jnp.zeros((batch,), jnp.int32), scored=jnp.ones((batch,), jnp.bool_),
                   settled=state.settled, hopeless=state.hopeless,
                   depth_used=state.depth_used)
  return jax.lax.while_loop(
      lambda r: jnp.any(_can_step(r, search)),
      lambda r: _replay_step(r, tree, same, scores.logits, context, search), start)


def commit(state: State, tree: Tree, scores: Scores, replayed: Replayed) -> State:
  """The state after the round: each new beam's cache is its parent's chain row (a gather
  within the row's block), whose positions up to the beam's last token the call wrote;
  the length says where it ends. Beams on a chain keep their next logits (in this call)
  for the next draft."""
  b, r = state.beam, replayed
  batch, k = b.live_logprobs.shape
  gamma = tree.path.shape[2]
  kv = lambda xs: tuple(_blocks(x, r.parents) for x in xs)     # [B*M] -> [B*K]
  cache = b.cache.replace(self_key=kv(scores.cache.self_key),
                          self_value=kv(scores.cache.self_value))
  cache = cache.with_length(b.cache.length + jnp.repeat(r.depth, k))
  ahead = scores.logits[jnp.arange(batch)[:, None], jnp.maximum(r.beam.cache, 0),
                        jnp.minimum(r.depth, gamma)[:, None]]
  return State(beam=r.beam.replace(cache=cache),
               drafter=_drafter_rows(tree, state.drafter, r.parents),
               settled=r.settled, hopeless=r.hopeless, depth_used=r.depth_used,
               rounds=state.rounds + 1, known=r.beam.cache >= 0, logits=ahead)


def finish(state: State, search: Search, drafter_kind: str) -> SpeculativeBeamOutput:
  """The output once no row goes on: T5X's beams and scores (`beam.result`), the best
  beam's tokens and length, the counters."""
  config, gamma = search.config, search.gamma
  beams, scores = beam.result(state.beam)
  beams = beams[:, :, 1:]                                              # [B, K, T]
  batch, k = scores.shape
  is_eos = beams[:, -1] == config.eos_id
  taken = state.beam.cur_index
  lengths = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1,
                      taken).astype(jnp.int32)
  calls = jnp.full((batch,), state.rounds, jnp.int32)
  counters = DecodeStats.zeros(batch, gamma).replace(
      rounds=state.rounds, target_calls=calls, drafter_calls=gamma * calls,
      drafted=sum(search.sizes[1:]) * calls,                       # the tree's nodes
      accepted=k * jnp.sum(state.depth_used, axis=1),
      per_position_accepted=state.depth_used, emitted=lengths)
  return SpeculativeBeamOutput(
      tokens=beams[:, -1], lengths=lengths, counters=counters,
      info=(("method", SpeculativeBeam.name), ("lossy", False), ("num_beams", k),
            ("beam_alpha", config.alpha), ("gamma", gamma), ("drafter", drafter_kind),
            ("exact", search.exact)),
      beams=beams, scores=scores, steps=jnp.max(taken))


# ----------------------------------------------------------------------------- the replay


def _can_step(r: Replayed, search: Search) -> Array:
  """bool [B]: the row's new beams are all scored, a drafted depth is left, and T5X's
  loop is known to go on (`_go`)."""
  return r.scored & (r.depth <= search.gamma) & _go(r.beam.cur_index, r.settled,
                                                    r.hopeless, search.config)


def _replay_step(r: Replayed, tree: Tree, same: Array, logits: Array, context: Context,
                 search: Search) -> Replayed:
  """One beam step of every row that can take one (`_can_step`); the others unchanged."""
  config, gamma = search.config, search.gamma
  batch = r.depth.shape[0]
  go = _can_step(r, search)
  on = jnp.maximum(r.beam.cache, 0)
  new = _step_rows(r.beam, logits[jnp.arange(batch)[:, None], on, r.depth[:, None]], config,
                   context.initial_index)
  parent = new.cache                                                 # [B, K] its chain
  token = jnp.take_along_axis(new.live_seqs, new.cur_index[:, None, None], axis=2)[..., 0]
  # A new beam is scored when a chain of its parent's prefix has its token next.
  shared = jnp.take_along_axis(_take(same, parent), r.depth[:, None, None, None],
                               axis=3)[..., 0]                       # [B, K, M]
  nxt = jnp.take_along_axis(tree.path, jnp.minimum(r.depth, gamma - 1)[:, None, None],
                            axis=2)[..., 0]                          # [B, M]
  match = shared & (nxt[:, None, :] == token[..., None])
  inside = (r.depth < gamma)[:, None]
  if search.check_scored:
    hit, row = inside & jnp.any(match, axis=2), jnp.argmax(match, axis=2)
  else:                   # the negative control: stay on the parent's chain regardless
    hit, row = jnp.broadcast_to(inside, parent.shape), parent
  new = new.replace(cache=jnp.where(hit, row, -1).astype(jnp.int32))
  new_settled, new_hopeless = beam.row_flags(new, config)
  used = r.depth_used.at[jnp.arange(batch), jnp.maximum(r.depth - 1, 0)].add(
      (go & (r.depth > 0)).astype(jnp.int32))
  return Replayed(beam=_where_rows(go, new, r.beam),
                  parents=jnp.where(go[:, None], parent, r.parents), depth=r.depth + go,
                  scored=jnp.where(go, jnp.all(hit, axis=1), r.scored),
                  settled=_record(r.settled, new.cur_index, new_settled, go),
                  hopeless=_record(r.hopeless, new.cur_index, new_hopeless, go),
                  depth_used=used)


# ----------------------------------------------------------------------------- the tree


def _drafter_search(drafter: Any, state: State,
                    search: Search) -> tuple[list[Array], list[Array], list[Any]]:
  """The drafter's beam search over the tree's levels: (parents, tokens) int32 [B, size_d]
  per level d = 1 .. G (each node's parent among the level above's first K), and the
  drafter's states after feeding levels 0 .. G-1 (over [B*K])."""
  b = state.beam
  batch, k = b.live_logprobs.shape
  gamma, sizes, eos_id = search.gamma, search.sizes, search.config.eos_id
  seqs, n = b.live_seqs.reshape(batch * k, -1), jnp.repeat(b.cur_index, k)
  logits, dstate = drafter.first(state.drafter, seqs, n)
  snapshots, parents, tokens, lp = [dstate], [], [], b.live_logprobs
  for depth in range(1, gamma + 1):
    logp = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(batch, k, -1)
    if depth == 1:
      logp = jnp.where(state.known[..., None], jax.nn.log_softmax(state.logits), logp)
    vocab = logp.shape[-1]
    if eos_id >= 0:
      logp = jnp.where(jnp.arange(vocab) == eos_id, -jnp.inf, logp)
    lp, parent, token = _top_nodes(lp[:, :k, None] + logp, sizes[depth])
    parents.append(parent)                                   # into the level above's first K
    tokens.append(token)
    if depth < gamma:
      dstate = _gather_drafter(dstate, parents[-1][:, :k], batch * k)
      logits, dstate = drafter.next(dstate, tokens[-1][:, :k].reshape(-1))
      snapshots.append(dstate)
  return parents, tokens, snapshots


def _chains(parents: list[Array], tokens: list[Array], snapshots: list[Any],
            search: Search) -> Tree:
  """The tree (`_drafter_search`'s levels) cut into `search.chains` chains per row."""
  gamma, sizes, k = search.gamma, search.sizes, search.config.num_beams
  batch, big = parents[0].shape[0], max(sizes) + 1
  # Every node of the tree, level by level (level 0: the live beams).
  root = [jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (batch, k))]
  path = [jnp.zeros((batch, k, gamma), jnp.int32)]
  for depth in range(1, gamma + 1):
    root.append(_take(root[-1], parents[depth - 1]))
    path.append(_take(path[-1], parents[depth - 1]).at[:, :, depth - 1].set(tokens[depth - 1]))
  # A chain follows first children (the lowest index among a node's children) down to
  # the deepest one; a chain starts at each live beam and at every other child.
  arange = [jnp.arange(size, dtype=jnp.int32) for size in sizes]
  child = [jnp.min(jnp.where(parents[d][:, None, :] == arange[d][None, :, None], arange[d + 1],
                             sizes[d + 1]), axis=2) for d in range(gamma)]   # [B, size_d]
  end_level = [jnp.full((batch, sizes[gamma]), gamma, jnp.int32)]
  end_node = [jnp.broadcast_to(arange[gamma], (batch, sizes[gamma]))]
  for depth in range(gamma - 1, -1, -1):
    has = child[depth] < sizes[depth + 1]
    first_child = jnp.minimum(child[depth], sizes[depth + 1] - 1)
    end_level.insert(0, jnp.where(has, _take(end_level[0], first_child), depth))
    end_node.insert(0, jnp.where(has, _take(end_node[0], first_child), arange[depth]))
  starts = [jnp.ones((batch, k), jnp.bool_)] + [
      _take(child[depth - 1], parents[depth - 1]) != arange[depth]
      for depth in range(1, gamma + 1)]
  level_of = jnp.concatenate([jnp.full((size,), d, jnp.int32) for d, size in enumerate(sizes)])
  index_of = jnp.concatenate(arange)                                     # [C]: all nodes
  offset = jnp.cumsum(jnp.array([0] + sizes[:-1], jnp.int32))
  order = -(level_of * big + index_of)                                   # shallow, then first
  rank = jnp.where(jnp.concatenate(starts, 1), order, -(gamma + 2) * big)
  start = jax.lax.top_k(rank, search.num_chains)[1]      # [B, M]: the live beams first, in order
  end = _take(jnp.concatenate(end_level, 1), start)
  chosen = offset[end] + _take(jnp.concatenate(end_node, 1), start)     # the chains' ends
  roots, paths = jnp.concatenate(root, 1), jnp.concatenate(path, 1)      # [B, C], [B, C, G]
  # The drafter fed the first K nodes of levels 0 .. gamma - 1; a chain ending elsewhere
  # reads its end's parent's state (which holds every token of the chain but the last).
  fed = (end < gamma) & (index_of[chosen] < k)
  parent_of = jnp.concatenate([jnp.zeros((batch, k), jnp.int32)] + parents, 1)
  stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *snapshots)
  return Tree(root=_take(roots, chosen), path=_take(paths, chosen),
              level=jnp.where(fed, end, end - 1),
              node=jnp.where(fed, index_of[chosen], _take(parent_of, chosen)),
              snapshots=stacked)



# ----------------------------------------------------------------------------- helpers


def _go(steps: Array, settled: Array, hopeless: Array, config: beam.SearchConfig) -> Array:
  """bool [B]: may row r take its next step? `beam.cond` at step steps[r] [B], known from
  the rows that have been there (settled / hopeless [B, L]: the flags they recorded)."""
  batch = steps.shape[0]
  seen = steps[:, None] >= steps[None, :]                                # [q, r]
  at = jnp.broadcast_to(steps[None, :], (batch, batch))
  open_rows = jnp.any(seen & ~jnp.take_along_axis(settled, at, axis=1), axis=0)
  hopeful = (steps == 0) | jnp.any(seen & ~jnp.take_along_axis(hopeless, at, axis=1), axis=0)
  not_at_end = steps < config.max_decode_len - 1
  under = (config.max_decode_step <= 0) | (steps < config.max_decode_step)
  return open_rows & hopeful & not_at_end & under


def _record(hist: Array, steps: Array, flag: Array, where: Array) -> Array:
  """hist [B, L] with flag [B] written at each row's step where `where` [B]."""
  rows = jnp.arange(hist.shape[0])
  return hist.at[rows, steps].set(jnp.where(where, flag, hist[rows, steps]))


def _step_rows(state: beam.BeamState, logits: Array, config: beam.SearchConfig,
               initial_index: Array | None) -> beam.BeamState:
  """`beam.step` for each row at its own `cur_index` [B]. logits f32 [B, K, V];
  state.cache: int [B, K] (the chain each beam is on), gathered by parent.

  One row at a time (`lax.map`), each at a SCALAR `cur_index` as in `beam.search`: XLA
  rounds a power of a scalar and of a vector differently (their last bits differ), and
  the brevity penalty must round as T5X's loop rounds it."""
  take = lambda c, index: jnp.take_along_axis(c, index, axis=1)

  def one(args) -> beam.BeamState:
    st, lg, ii = args
    row = jax.tree_util.tree_map(lambda x: x[None], st).replace(cur_index=st.cur_index)
    new = beam.step(row, lg, row.cache, config, take,
                    initial_index=None if ii is None else ii[None])
    return jax.tree_util.tree_map(lambda x: x[0], new.replace(cur_index=new.cur_index[None]))

  return jax.lax.map(one, (state, logits, initial_index))


def _where_rows(pick: Array, new: Any, old: Any) -> Any:
  """Per row b: new's leaves where pick [B], else old's (leaves [B, ...])."""
  return jax.tree_util.tree_map(
      lambda a, b: jnp.where(pick.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, old)


def _gather_drafter(state: Any, index: Array, rows: int) -> Any:
  """The drafter's state over [B*K] beams reordered within each row by index [B, K]."""
  if isinstance(state, DecoderCache):
    return beam.gather_cache(state, index)
  return jax.tree_util.tree_map(
      lambda x: beam.gather_beams(x, index) if x.ndim and x.shape[0] == rows else x, state)


def _blocks(x: Array, index: Array) -> Array:
  """x [B*N, ...] -> [B*M, ...]: row m of block b is row index[b, m] (< N) of block b."""
  batch, m = index.shape
  y = x.reshape((batch, x.shape[0] // batch) + x.shape[1:])
  idx = index.reshape((batch, m) + (1,) * (x.ndim - 1))
  return jnp.take_along_axis(y, idx, axis=1).reshape((batch * m,) + x.shape[1:])


def _take(x: Array, index: Array) -> Array:
  """x [B, N, ...] at index [B, M] along axis 1."""
  return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def _top_nodes(scores: Array, n: int) -> tuple[Array, Array, Array]:
  """The best n (node, token) pairs of scores f32 [B, K, V]: (values [B, n], node [B, n],
  token [B, n]), as `lax.top_k` over the flat [B, K*V] orders them (ties: lower node,
  then lower token). Two stages, as T5X's beam search: each node's best n, then the best n
  of those K*n. XLA:CPU turned the one-stage top-k over K*V (the first level's, keeping
  2K) inside the round into a full stable sort of every row: ~6 ms a row and round for
  the demo's 4 x 8,000 lattice, where the drafter's own calls take 0.3 ms."""
  batch, k, vocab = scores.shape
  n1 = min(n, vocab)
  values, tokens = sampling_lib.top_k(scores, n1)                      # [B, K, n1]
  values, index = jax.lax.top_k(values.reshape(batch, k * n1), n)
  token = jnp.take_along_axis(tokens.reshape(batch, k * n1), index, axis=1)
  return values, (index // n1).astype(jnp.int32), token.astype(jnp.int32)



def _drafter_rows(tree: Tree, first: Any, row: Array) -> Any:
  """The drafter's state for beams on chains row [B, K]: each chain's snapshot (its
  drafted node's, whose cache holds the chain's tokens); `first`: a state of the same
  structure over [B*K] (its parts that are the same for a row's beams are kept)."""
  batch, k = row.shape
  rows = batch * k
  flat = (_take(tree.level, row) * rows + jnp.arange(batch)[:, None] * k
          + _take(tree.node, row)).reshape(-1)
  pick = lambda x: x.reshape((-1,) + x.shape[2:])[flat]
  if isinstance(first, DecoderCache):
    return first.replace(self_key=tuple(map(pick, tree.snapshots.self_key)),
                         self_value=tuple(map(pick, tree.snapshots.self_value)))
  return jax.tree_util.tree_map(
      lambda x: pick(x) if x.ndim >= 2 and x.shape[1] == rows else x[0], tree.snapshots)

