"""The token buffer: emit (counts, EOS, limits, done rows), the last tokens, zeros after EOS."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.rounds import buffer

pytestmark = pytest.mark.unit

# One program per shape (op by op, every primitive would compile on its own).
emit = jax.jit(buffer.emit, static_argnums=(5,))


def test_emit_follows_the_worked_example():
  # T = 6, eos 1; rows at n = 2, 2, 4, 4 (row 3 done): the docstring's table.
  seq = jnp.zeros((4, 7), jnp.int32).at[:, 1:3].set(5).at[2:, 3:5].set(6)
  n = jnp.array([2, 2, 4, 4])
  done = jnp.array([False, False, False, True])
  candidates = jnp.array([[7, 8, 9], [7, 1, 9], [7, 8, 9], [7, 8, 9]])
  seq, n, done, emitted = emit(seq, n, done, candidates, jnp.array([2, 3, 3, 3]), 1)
  np.testing.assert_array_equal(emitted, [2, 2, 2, 0])
  np.testing.assert_array_equal(n, [4, 4, 6, 4])
  np.testing.assert_array_equal(done, [False, True, True, True])
  np.testing.assert_array_equal(seq, [[0, 5, 5, 7, 8, 0, 0],      # nothing past the count
                                      [0, 5, 5, 7, 1, 0, 0],      # nothing past EOS
                                      [0, 5, 5, 6, 6, 7, 8],      # nothing past T
                                      [0, 5, 5, 6, 6, 0, 0]])     # a done row never changes


def test_emit_with_per_row_limits_and_stop_masks():
  seq = buffer.init_sequence(2, 5, jnp.array([3, 4]))
  np.testing.assert_array_equal(seq[:, 0], [3, 4])
  n, done = jnp.zeros(2, jnp.int32), jnp.zeros(2, bool)
  cand = jnp.array([[7, 8, 9], [7, 8, 9]])
  stops = jnp.array([[False, True, False], [False, False, False]])
  seq, n, done, emitted = emit(seq, n, done, cand, jnp.array([3, 3]), None,
                                      stops=stops, limit=jnp.array([5, 2]))
  np.testing.assert_array_equal(emitted, [2, 2])       # row 0: its stop; row 1: its limit
  np.testing.assert_array_equal(done, [True, True])
  np.testing.assert_array_equal(seq[:, 1:4], [[7, 8, 0], [7, 8, 0]])
  # eos_id -1 (never stop): a candidate -1 is impossible, so only T ends a row.
  seq2, n2, done2, _ = emit(buffer.init_sequence(1, 3, 0), jnp.zeros(1, jnp.int32),
                                   jnp.zeros(1, bool), jnp.array([[1, 1]]), jnp.array([2]), -1)
  assert int(n2[0]) == 2 and not bool(done2[0])


def test_a_stop_beyond_the_count_does_not_end_the_row():
  seq = buffer.init_sequence(1, 6, 0)
  _, n, done, emitted = emit(seq, jnp.zeros(1, jnp.int32), jnp.zeros(1, bool),
                                    jnp.array([[4, 5, 1]]), jnp.array([2]), 1)
  assert (int(n[0]), bool(done[0]), int(emitted[0])) == (2, False, 2)


def test_last_tokens_clamps_at_the_start():
  seq = jnp.array([[9, 1, 2, 3, 0], [9, 4, 0, 0, 0]])
  np.testing.assert_array_equal(buffer.last_tokens(seq, jnp.array([3, 1]), 3),
                                [[1, 2, 3], [9, 9, 4]])
  np.testing.assert_array_equal(buffer.last_tokens(seq, jnp.array([0, 1]), 1), [[9], [4]])
