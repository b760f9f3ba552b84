"""The research API: `engine.init_state` / `round_step` / `finish` driven by hand.

    state = init_state(target, proposer, inputs, config, rng)
    while cond(state): state = round_step(target, proposer, state, config)
    out = finish(state, config)

A loop written in Python (one jitted round at a time, state inspected between rounds) must
give `engine.run`'s and `sd.speculative_generate`'s tokens; under greedy decoding those are
the target's teacher-forced argmax, a reference that does not use the engine. Under
`jax.vmap` over independent requests (each its own batch of 1 and its own key), every
request's tokens are those of the request decoded alone.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import peaked, perturbed, ragged_tokens

import specdec_jax as sd
from specdec_jax.methods import speculative
from specdec_jax.rounds import engine

GAMMA = 3
MAX_NEW = 11   # not a multiple of gamma + 1: the last round is cut by the length cap


@pytest.fixture(scope="module")
def target():
  return peaked(sd.init_model(sd.get_config("t5_1_1_tiny"), 1), 6.0, 3.0)


@pytest.fixture(scope="module")
def drafter(target):
  return perturbed(target, 0.05, seed=0)      # agrees with the target often, not always


@pytest.fixture(scope="module")
def inputs():
  return ragged_tokens(6, 12, 512, seed=1)


def _init(target, proposer, inputs, rng, config):
  return engine.init_state(target, proposer, inputs, config, rng, inputs)


init = jax.jit(_init, static_argnames="config")
step = jax.jit(engine.round_step, static_argnames="config")
finish = jax.jit(engine.finish, static_argnames="config")


def drive(target, proposer, inputs, rng, config):
  """The decode as a Python loop over rounds; checks what every round must do.

  Returns (DecodeOutput, number of rounds run).
  """
  state = init(target, proposer, jnp.asarray(inputs), rng, config)
  rounds = 0
  while bool(engine.cond(state)):
    before = jax.device_get(state)
    state = step(target, proposer, state, config)
    rounds += 1
    grown = np.asarray(state.n) - before.n
    live = ~before.done
    # A live row emits 1 .. gamma + 1 tokens a round (fewer only at the length cap);
    # a done row never changes.
    assert np.all(grown[live] >= 1) and np.all(grown[live] <= GAMMA + 1), grown
    assert np.all(grown[~live] == 0)
    np.testing.assert_array_equal(np.asarray(state.seq)[~live], before.seq[~live])
    assert rounds <= MAX_NEW
  return finish(state, config), rounds


def _assert_same_output(out, ref):
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)


@pytest.mark.slow
def test_hand_loop_equals_run_and_speculative_generate(target, drafter, inputs):
  config = speculative.round_config(GAMMA, MAX_NEW)
  proposer = speculative.proposer(drafter, target, GAMMA)
  rng = jax.random.PRNGKey(0)

  out, rounds = drive(target, proposer, inputs, rng, config)
  ran = engine.run(target, proposer, inputs, inputs, rng, config=config)
  ref = sd.speculative_generate(target, drafter, inputs, gamma=GAMMA,
                                max_new_tokens=MAX_NEW)
  _assert_same_output(out, ran)
  _assert_same_output(out, ref)
  # The counters too: the hand loop ran the same rounds as the jitted while_loop.
  jax.tree_util.tree_map(np.testing.assert_array_equal, out.counters, ran.counters)
  assert rounds == int(np.max(np.asarray(out.counters.rounds)))

  # Greedy: the target's own argmax given the emitted prefix, computed without the engine
  # (one teacher-forced forward pass), up to each row's length.
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  start = np.full((len(tokens), 1), target.config.decoder_start_id, np.int32)
  logits = target.forward(inputs, np.concatenate([start, tokens[:, :-1]], 1))
  valid = np.arange(MAX_NEW)[None] < lengths[:, None]
  np.testing.assert_array_equal(np.where(valid, np.argmax(logits, -1), 0), tokens)

  # The workload exercises what a wrong engine gets wrong: rejected drafts, rows that
  # stop at EOS in different rounds, and rows cut by the length cap.
  accepted = np.asarray(out.counters.accepted).sum()
  assert 0 < accepted < np.asarray(out.counters.drafted).sum()
  assert len(set(lengths.tolist())) >= 3 and (lengths == MAX_NEW).any()


@functools.partial(jax.jit, static_argnames="config")
def init_many(target, proposer, inputs, rngs, config):
  """[R, 1, L] requests, [R] keys -> R stacked states (vmap over the request axis)."""
  return jax.vmap(lambda e, k: _init(target, proposer, e, k, config))(inputs, rngs)


@functools.partial(jax.jit, static_argnames="config")
def step_many(target, proposer, states, config):
  return jax.vmap(lambda s: engine.round_step(target, proposer, s, config))(states)


@functools.partial(jax.jit, static_argnames="config")
def finish_many(states, config):
  return jax.vmap(lambda s: engine.finish(s, config))(states)


@pytest.mark.slow
def test_vmapped_rounds_equal_each_request_alone(target, drafter, inputs):
  sampling = sd.Sampling(temperature=1.0)
  config = speculative.round_config(GAMMA, MAX_NEW, sampling)
  proposer = speculative.proposer(drafter, target, GAMMA)
  requests = inputs[:, None, :]                          # [R, 1, L]: R requests
  rngs = jax.random.split(jax.random.PRNGKey(7), len(requests))  # one key per request

  states = init_many(target, proposer, requests, rngs, config)
  rounds = 0
  while bool(engine.cond(states)):   # any request still live (done ones stay unchanged)
    states = step_many(target, proposer, states, config)
    rounds += 1
    assert rounds <= MAX_NEW
  many = finish_many(states, config)
  assert many.tokens.shape == (len(requests), 1, MAX_NEW)

  for r in range(len(requests)):
    alone = sd.speculative_generate(target, drafter, requests[r], gamma=GAMMA,
                                    max_new_tokens=MAX_NEW, sampling=sampling, rng=rngs[r])
    np.testing.assert_array_equal(many.tokens[r], alone.tokens, err_msg=f"request {r}")
    np.testing.assert_array_equal(many.lengths[r], alone.lengths, err_msg=f"request {r}")
    # Per-row counters too (`rounds` counts the loop's iterations: those of the vmapped
    # loop run until the LAST request is done).
    # Float sums (log_prob) may round differently: XLA batches the vmapped products.
    for field in dataclasses.fields(alone.counters):
      if field.name != "rounds":
        np.testing.assert_allclose(getattr(many.counters, field.name)[r],
                                   getattr(alone.counters, field.name),
                                   rtol=1e-5, err_msg=f"request {r}: {field.name}")

  # Each request draws with its own key: two requests on the SAME input would differ
  # (as many requests as above: the vmapped programs compile once).
  twins = init_many(target, proposer, np.repeat(requests[:1], len(requests), 0), rngs, config)
  while bool(engine.cond(twins)):
    twins = step_many(target, proposer, twins, config)
  twins = finish_many(twins, config)
  assert not np.array_equal(twins.tokens[0], twins.tokens[1])
