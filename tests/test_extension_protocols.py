"""The extension points as an API: `sd.Drafter`, `sd.Proposer` and `sd.AcceptRule`.

The package's own drafters, proposers and rules satisfy the protocols; a near miss (a plain
class, a missing method, other arguments, another vocabulary, a rule that is not a frozen
dataclass or not hashable) is an `sd.InputError` naming it, raised before anything is
traced (not JAX's TypeError or ValueError from inside `jit`); a drafter and a rule written
by a user work through the engine and `sd.decode`.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import specdec_jax as sd
from specdec_jax import testing
from specdec_jax.drafters import DraftLoop, NoProposals, as_drafter, as_proposer
from specdec_jax.drafters.head_drafter import HeadDrafter
from specdec_jax.methods import speculative
from specdec_jax.methods.adaptive import Adaptive
from specdec_jax.rounds import acceptance, engine

ENC = np.array([[5, 6, 7, 1], [8, 9, 1, 0]], np.int32)


# ----------------------------------------------------------------------------- a user's pieces


def _one_hot(token, vocab):
  return jnp.where(jax.nn.one_hot(token, vocab) > 0, 0.0, -1e9)


@struct.dataclass
class RepeatLast:
  """Proposes the last token again (no `kind`: the optional label is left out)."""

  vocab_size: int = struct.field(pytree_node=False, default=512)

  def init(self, inputs, capacity, lengths=None):
    return jnp.zeros((inputs.shape[0],), jnp.int32)

  def first(self, state, seq, n):
    last = jnp.take_along_axis(seq, n[:, None], axis=1)[:, 0]
    return _one_hot(last, self.vocab_size), last

  def next(self, state, token):
    return _one_hot(token, self.vocab_size), token


@struct.dataclass
class TableArgmax:
  """Proposes the argmax of a [V, V] table's row for the last token: an array field."""

  table: jax.Array

  @property
  def vocab_size(self):
    return self.table.shape[-1]

  def init(self, inputs, capacity, lengths=None):
    return jnp.zeros((inputs.shape[0],), jnp.int32)

  def first(self, state, seq, n):
    last = jnp.take_along_axis(seq, n[:, None], axis=1)[:, 0]
    return self.next(state, last)

  def next(self, state, token):
    return _one_hot(jnp.argmax(self.table[token], -1), self.vocab_size), token


@dataclasses.dataclass(frozen=True)
class TopKGreedy:
  """Keep proposals while each is among the target's k likeliest tokens (k = 1: exact)."""

  k: int = 1
  lossy = True

  def __call__(self, logits, proposal, sampling, key):
    x, g = proposal.tokens, proposal.tokens.shape[1]
    kth = jax.lax.top_k(logits[:, :g], self.k)[0][..., -1]
    x_logit = jnp.take_along_axis(logits[:, :g], x[..., None], axis=-1)[..., 0]
    real = jnp.arange(g)[None] < proposal.count[:, None]
    ok = ((x_logit >= kth) & real).astype(jnp.int32)
    m = jnp.sum(jnp.cumprod(ok, axis=1), axis=1)
    after = jnp.take_along_axis(logits, m[:, None, None], axis=1)[:, 0]
    return acceptance.Acceptance(m=m, next_token=sd.sampling.draw(key, after, sampling),
                                 beta=ok.astype(jnp.float32),
                                 scored=(jnp.arange(g)[None] <= m[:, None]) & real)


V, T, GAMMA = 8, 7, 3
TABLE_ENC = np.array([[7, 2, 1], [3, 4, 1], [6, 5, 1]], np.int32)


@pytest.fixture(scope="module")
def table():
  rng = np.random.default_rng(0)
  inputs = rng.normal(size=(V, V)).astype(np.float32)
  return testing.TableModel(next_logits=2.0 * rng.normal(size=(V, V)).astype(np.float32),
                            position_logits=rng.normal(size=(T + GAMMA + 1, V)).astype(
                                np.float32),
                            input_logits=inputs)


def _run_table(table, rule, drafter=None):
  """The table target decoded with a user drafter (by default the target's table without
  its position and input terms: right often, not always) and a user rule; rows never stop
  early."""
  drafter = TableArgmax(table.next_logits) if drafter is None else drafter
  proposer = speculative.proposer(drafter, table, GAMMA)
  config = speculative.round_config(GAMMA, T, None, -1, accept=rule)
  return engine.run(table, proposer, TABLE_ENC, None, jax.random.key(0), config=config)


# ----------------------------------------------------------------------------- near misses


class Plain:
  """RepeatLast without the decorator: not a pytree."""

  vocab_size = 512
  init, first, next = RepeatLast.init, RepeatLast.first, RepeatLast.next


@struct.dataclass
class StringLeaf(RepeatLast):
  """A setting left a pytree field."""

  label: str = "mine"


@struct.dataclass
class NoNext:
  vocab_size: int = struct.field(pytree_node=False, default=512)
  init, first = RepeatLast.init, RepeatLast.first


@struct.dataclass
class NextWithoutState(RepeatLast):
  def next(self, token):                           # forgot the state argument
    return _one_hot(token, self.vocab_size), token


@struct.dataclass
class NoUpdate:
  """A proposer without `update`."""

  vocab_size: int = struct.field(pytree_node=False, default=512)

  def init(self, inputs, capacity, lengths=None):
    return jnp.zeros(())

  def propose(self, state, ctx, key):
    raise AssertionError("never traced")


class BareProposer:
  vocab_size = 512
  init, propose = NoUpdate.init, NoUpdate.propose

  def update(self, state, outcome):
    return state


@dataclasses.dataclass
class Loose:
  """A rule that is a dataclass but not frozen."""

  k: int = 1

  def __call__(self, logits, proposal, sampling, key):
    return TopKGreedy(self.k)(logits, proposal, sampling, key)


@dataclasses.dataclass(frozen=True)
class ArrayRule:
  """Frozen, but an array field: not hashable."""

  weights: jax.Array = dataclasses.field(default_factory=lambda: jnp.ones(3))

  def __call__(self, logits, proposal, sampling, key):
    return TopKGreedy()(logits, proposal, sampling, key)


@dataclasses.dataclass(frozen=True)
class TwoArguments:
  def __call__(self, logits, proposal):
    raise AssertionError("never traced")


@pytest.fixture
def no_tracing(monkeypatch):
  """The jitted decode loop fails the test if it is ever reached."""
  def traced(*args, **kwargs):
    raise AssertionError("the request reached the jitted engine")
  monkeypatch.setattr(engine, "_run", traced)


@pytest.mark.parametrize("drafter, message", [
    (Plain(), r"the drafter Plain is not a JAX pytree: decorate it with @flax\.struct"),
    (StringLeaf(), r"the drafter StringLeaf has a leaf \.label of type str, which jax\.jit"),
    (NoNext(), r"not a drafter: NoNext has no `next`; a drafter \(sd\.Drafter\) needs"),
    (object(), r"not a drafter: object has no `vocab_size`, `init`, `first`, `next`"),
    (NextWithoutState(), r"NextWithoutState\.next cannot be called as next\(state, token\)"),
    (RepeatLast(vocab_size=100), "vocabulary mismatch: drafter has vocab_size 100, target "
                                 "has 512"),
    (RepeatLast(vocab_size="512"), r"RepeatLast\.vocab_size must be an integer >= 1"),
    (NoUpdate(), r"not a proposer: NoUpdate has no `update`; a proposer \(sd\.Proposer\)"),
    (BareProposer(), "the proposer BareProposer is not a JAX pytree"),
], ids=["plain-class", "string-leaf", "no-next", "nothing", "next-arity", "vocabulary",
        "vocab-type", "no-update", "plain-proposer"])
def test_a_near_miss_drafter_is_an_input_error_before_tracing(t5x_model, no_tracing, drafter,
                                                              message):
  with pytest.raises(sd.InputError, match=message):
    sd.decode(t5x_model, sd.Speculative(drafter, gamma=3), ENC, max_new_tokens=4)


def test_bild_checks_its_small_model_alike(t5x_model, no_tracing):
  with pytest.raises(sd.InputError, match="the drafter Plain is not a JAX pytree"):
    sd.decode(t5x_model, sd.BiLD(Plain()), ENC, max_new_tokens=4)


def test_a_decoder_only_target_needs_init_to_take_lengths():
  @struct.dataclass
  class TwoArgumentInit(RepeatLast):
    def init(self, inputs, capacity):      # enough for T5, not for an LM's prompts
      return jnp.zeros((inputs.shape[0],), jnp.int32)

  @struct.dataclass
  class TableLM(testing.TableModel):
    is_decoder_only = True                         # the same table read as an LM

  as_drafter(TwoArgumentInit(), testing.TableModel(jnp.zeros((512, 512))))   # T5: fine
  with pytest.raises(sd.InputError, match=r"cannot be called as init\(inputs, "
                                          r"capacity, lengths=None\)"):
    as_drafter(TwoArgumentInit(), TableLM(jnp.zeros((512, 512))))


@pytest.mark.parametrize("make, message", [
    (lambda: sd.Speculative(None, accept=Loose()),
     r"the acceptance rule Loose must be a frozen dataclass \(@dataclasses\.dataclass"),
    (lambda: sd.Blockwise(None, accept=Loose()), "the acceptance rule Loose must be a frozen"),
    (lambda: sd.Speculative(None, accept=ArrayRule()),
     "the acceptance rule ArrayRule must be hashable, a frozen dataclass of settings"),
    (lambda: sd.Speculative(None, accept=TwoArguments()),
     r"TwoArguments cannot be called as rule\(logits, proposal, sampling, key\)"),
    (lambda: sd.Speculative(None, accept="greedy"), "accept must be an acceptance rule"),
], ids=["not-frozen", "not-frozen-blockwise", "array-field", "arity", "not-callable"])
def test_a_near_miss_rule_is_an_input_error_when_the_method_is_made(make, message):
  with pytest.raises(sd.InputError, match=message):
    make()


@struct.dataclass
class LogitsOnly(RepeatLast):
  def first(self, state, seq, n):                  # forgot the state
    return RepeatLast.first(self, state, seq, n)[0]


@struct.dataclass
class ExtraAxis(RepeatLast):
  def next(self, state, token):                    # logits [B, 1, V]
    logits, state = RepeatLast.next(self, state, token)
    return logits[:, None], state


@struct.dataclass
class FloatState(RepeatLast):
  def first(self, state, seq, n):                  # init's state is int32 [B]
    logits, last = RepeatLast.first(self, state, seq, n)
    return logits, last.astype(jnp.float32)


@pytest.mark.parametrize("drafter, message", [
    (LogitsOnly(vocab_size=V), r"LogitsOnly\.first must return a pair \(logits \[B, V\], "
                               r"state\), got"),
    (ExtraAxis(vocab_size=V), r"ExtraAxis\.next returned logits of shape \(3, 1, 8\) .*"
                              r"floating \[B, V\] = \[3, 8\]"),
    (FloatState(vocab_size=V), r"FloatState\.first returned a state unlike init's"),
], ids=["not-a-pair", "logits-shape", "state-dtype"])
def test_what_a_drafter_returns_is_checked_when_traced(table, drafter, message):
  """Mistakes only tracing can see are InputErrors too, not JAX's unpacking or
  `lax.cond` type errors."""
  with pytest.raises(sd.InputError, match=message):
    _run_table(table, TopKGreedy(), drafter)


# ----------------------------------------------------------------------------- the protocols


def test_the_package_drafters_satisfy_the_drafter_protocol(t5x_model):
  drafters = [sd.ModelDrafter(t5x_model), sd.NGramDrafter.fit([[5, 6, 7]], vocab_size=512),
              sd.PromptLookupDrafter(512), sd.early_exit(t5x_model, 1),
              testing.table_drafter(jnp.zeros((512, 512))), RepeatLast(),
              TableArgmax(jnp.zeros((512, 512)))]
  for drafter in drafters:
    assert isinstance(drafter, sd.Drafter), drafter
    assert as_drafter(drafter, t5x_model) is drafter
  assert isinstance(as_drafter(t5x_model, t5x_model), sd.ModelDrafter)   # a Model is wrapped
  for other in (t5x_model, object(), NoNext(), RepeatLast.first):
    assert not isinstance(other, sd.Drafter), other


def test_the_package_proposers_satisfy_the_proposer_protocol(t5x_model):
  loop = DraftLoop(sd.ModelDrafter(t5x_model))
  proposers = [loop, NoProposals(512), Adaptive(loop, sd.AdaptiveGamma(), 4),
               HeadDrafter(t5x_model, sd.init_heads(t5x_model, 3)),
               testing.ScriptedProposer(jnp.zeros((2, 4), jnp.int32), vocab_size=512)]
  for proposer in proposers:
    assert isinstance(proposer, sd.Proposer), proposer
    assert as_proposer(proposer, t5x_model) is proposer
  assert not isinstance(RepeatLast(), sd.Proposer)
  assert isinstance(as_proposer(RepeatLast(), t5x_model), DraftLoop)     # a drafter is wrapped


def test_the_package_rules_satisfy_the_rule_protocol():
  class KeepAll:                        # a plain class hashes by identity: still accepted
    def __call__(self, logits, proposal, sampling, key):
      raise AssertionError("never traced")

  rules = [acceptance.TargetOnly(), acceptance.SpeculativeSampling(),
           acceptance.SpeculativeSampling(lenience=0.5), acceptance.Rollback(2.0),
           TopKGreedy(2), KeepAll()]
  for rule in rules:
    assert isinstance(rule, sd.AcceptRule), rule
    acceptance.check_rule(rule)
    assert sd.Speculative(None, accept=rule).accept is rule
  assert TopKGreedy(2) == TopKGreedy(2) and hash(TopKGreedy(2)) == hash(TopKGreedy(2))


# ----------------------------------------------------------------------------- they work


def test_a_user_drafter_and_rule_run_through_the_engine(table):
  tokens, lengths = testing.reference_greedy(table, TABLE_ENC, T, eos_id=-1)
  exact = _run_table(table, TopKGreedy(k=1))
  np.testing.assert_array_equal(exact.tokens, tokens)
  np.testing.assert_array_equal(exact.lengths, lengths)
  assert 0 < exact.stats["accepted"] < exact.stats["drafted"]      # kept some, not all


@pytest.mark.slow
def test_a_lenient_user_rule_keeps_every_proposal(table):
  exact, every = _run_table(table, TopKGreedy(k=1)), _run_table(table, TopKGreedy(k=V))
  assert every.stats["accepted"] == every.stats["drafted"] > 0
  assert every.stats["lossy"]
  assert every.stats["tokens_per_target_call"] > exact.stats["tokens_per_target_call"]


def test_a_drafter_without_a_kind_is_reported_as_custom(table):
  config = sd.BiLD(RepeatLast(vocab_size=V)).round_config(table, T, sd.Greedy(), 1)
  assert dict(config.info)["small"] == "custom"
  assert DraftLoop(RepeatLast(vocab_size=V)).kind == "custom"


@pytest.mark.slow
def test_a_user_drafter_and_rule_run_through_decode(t5x_model):
  base = sd.decode(t5x_model, sd.Autoregressive(), ENC, max_new_tokens=6)
  out = sd.decode(t5x_model, sd.Speculative(RepeatLast(), gamma=3, accept=TopKGreedy(1)),
                  ENC, max_new_tokens=6)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  assert out.stats["drafted"] > 0 and out.stats["lossy"]
  bild = sd.decode(t5x_model, sd.BiLD(RepeatLast(), rollback_threshold=np.inf), ENC,
                   max_new_tokens=6)
  assert bild.stats["small"] == "custom" and bild.tokens.shape == (2, 6)


def test_a_hand_built_round_config_refuses_a_rule_jit_cannot_take():
  """Research code replacing the rule of a RoundConfig gets the InputError too, not JAX's
  'Non-hashable static arguments' at the first call."""
  import dataclasses

  from specdec_jax.rounds import engine

  class Mutable:
    __hash__ = None

    def __call__(self, logits, proposal, sampling, key):
      raise AssertionError("never called")

  config = engine.RoundConfig(max_new_tokens=4, max_proposals=2)
  with pytest.raises(sd.InputError, match="Mutable"):
    dataclasses.replace(config, accept=Mutable())
