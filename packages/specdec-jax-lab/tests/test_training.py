"""specdec_jax_lab.training on a tiny model: optimisation, exact Orbax resume, batch order,
distillation, shift_right."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax_lab import training

CONFIG = sd.get_config("t5_1_1_tiny").replace(
    vocab_size=64, emb_dim=32, mlp_dim=64, num_heads=2, head_dim=16,
    num_encoder_layers=1, num_decoder_layers=1)
LENGTH = 8


def copy_task(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Random sequences of 3..7 tokens (ids 3..63) + EOS, 0-padded to LENGTH; target = input."""
  rng = np.random.default_rng(seed)
  inputs = np.zeros((n, LENGTH), np.int32)
  for i in range(n):
    k = rng.integers(3, LENGTH)
    inputs[i, :k] = rng.integers(3, CONFIG.vocab_size, k)
    inputs[i, k] = 1
  return inputs, inputs.copy()


_OPTIMIZERS = {}
_make_optimizer = training.make_optimizer


@pytest.fixture(autouse=True)
def shared_optimizers(monkeypatch):
  """train_step's jit cache is keyed on the optimizer object (a static field of TrainState),
  and train() builds a new one per call: share one between runs with equal optimizer
  settings, so those runs compile train_step once (the maths is unchanged)."""
  def make(cfg):
    key = (cfg.learning_rate, cfg.warmup_steps, cfg.weight_decay)
    return _OPTIMIZERS.setdefault(key, _make_optimizer(cfg))
  monkeypatch.setattr(training, "make_optimizer", make)


@pytest.fixture(scope="module")
def model():
  """Host (numpy) params: never donated by train_step."""
  m = sd.init_model(CONFIG, 0)
  return m.replace(params=jax.device_get(m.params))


@pytest.fixture(scope="module")
def data():
  return copy_task(32)


def batch_of(inputs, targets):
  return {"inputs": jnp.asarray(inputs), "targets": jnp.asarray(targets)}


def loss_of(params, batch):
  return float(training.loss_fn(params, CONFIG, batch, jax.random.PRNGKey(0))[0])


def on_device(model):
  """The model with its own device copy of the params, committed to the device like
  Orbax-restored arrays (train_step donates its state's buffers, and train() starts from
  `model.params` itself, so every run needs its own copy).

  Host (numpy) params, as in the `model` fixture, are never donated: train_step copies
  them in. Their first step compiles like every later one; a run from committed params
  compiles its first step separately but then matches a resumed run's steps, which is
  what the resume test uses.
  """
  return model.replace(params=jax.device_put(jax.device_get(model.params), jax.devices()[0]))


def run_steps(model, batch, cfg, steps, teacher=None):
  state = training.init_train_state(model.params, training.make_optimizer(cfg))
  objective = training.TokenLoss(CONFIG, 0.0, teacher, 1.0)     # as train() builds it
  for step in range(steps):
    state, metrics = training.train_step(state, batch, jax.random.PRNGKey(step), objective)
  return state, metrics


def tree_equal(a, b):
  return all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b),
                             strict=True))


# ----------------------------------------------------------------------------- optimisation


# One optimizer setting and batch shape for the loss test and the Orbax runs: one compile.
OPT = dict(learning_rate=1e-2, warmup_steps=5)
BATCH = 8


@pytest.mark.slow
def test_optax_steps_reduce_the_loss(model, data):
  batch = batch_of(data[0][:BATCH], data[1][:BATCH])
  initial = loss_of(model.params, batch)
  assert initial == pytest.approx(np.log(CONFIG.vocab_size), rel=0.25)   # near uniform
  cfg = training.TrainConfig(**OPT)
  state, metrics = run_steps(model, batch, cfg, 40)
  final = loss_of(state.params, batch)
  assert int(state.step) == 40
  assert final < 0.6 * initial, (initial, final)
  assert 0.0 <= float(metrics["accuracy"]) <= 1.0


@pytest.mark.slow
def test_adafactor_steps_reduce_the_loss(model, data):
  batch = batch_of(data[0][:BATCH], data[1][:BATCH])
  initial = loss_of(model.params, batch)
  state, _ = run_steps(model, batch, training.TrainConfig(optimizer="adafactor", **OPT), 40)
  assert loss_of(state.params, batch) < 0.6 * initial


def test_schedule_warms_up_stays_flat_then_decays():
  cfg = training.TrainConfig(learning_rate=0.01, warmup_steps=10, decay_start=40)
  lr = training.learning_rate_schedule(cfg)
  np.testing.assert_allclose([float(lr(s)) for s in (1, 5, 10, 25, 40, 160)],
                             [0.001, 0.005, 0.01, 0.01, 0.01, 0.005], rtol=1e-6)
  t5 = training.learning_rate_schedule(training.TrainConfig(learning_rate=0.01,
                                                            warmup_steps=10))
  assert float(t5(40)) == pytest.approx(0.01 * 0.5)       # decay_start 0: from warm-up on
  with pytest.raises(ValueError, match="optimizer must be one of"):
    training.TrainConfig(optimizer="sgd")


@pytest.mark.slow
def test_zero_learning_rate_changes_nothing(model, data):
  batch = batch_of(*data)
  initial = loss_of(model.params, batch)
  state, _ = run_steps(model, batch, training.TrainConfig(learning_rate=0.0, warmup_steps=5), 5)
  assert tree_equal(state.params, model.params)
  assert loss_of(state.params, batch) == initial


# ----------------------------------------------------------------------------- Orbax resume


@pytest.mark.slow
def test_resume_continues_exactly(model, data, tmp_path):
  inputs, targets = data

  def run(steps, workdir):
    cfg = training.TrainConfig(steps=steps, batch_size=BATCH, checkpoint_every=3, seed=7, **OPT)
    return training.train(on_device(model), inputs, targets, cfg, tmp_path / workdir,
                          progress=False)

  straight, hist_a = run(6, "a")                 # 6 steps straight through
  part, hist_b1 = run(3, "b")                    # 3 steps, checkpoint at step 3 ...
  assert not tree_equal(part.params, straight.params)
  assert [h["step"] for h in hist_b1] == [3]
  assert (tmp_path / "b" / "checkpoints" / "3").is_dir()
  resumed, hist_b2 = run(6, "b")                 # ... then resumed to 6

  assert tree_equal(resumed.params, straight.params)      # bit-identical
  # history continues from the checkpoint: step 3 kept, step 6 as in the straight run
  assert [h["step"] for h in hist_b2] == [3, 6]
  assert hist_b2[0] == hist_b1[0]
  assert hist_b2[1] == hist_a[-1]
  on_disk = [json.loads(s) for s in (tmp_path / "b" / "history.jsonl").read_text().splitlines()]
  assert on_disk == hist_b2

  # a finished run resumes to itself without further steps
  again, hist_again = run(6, "b")
  assert tree_equal(again.params, resumed.params) and hist_again == hist_b2


def test_resume_under_other_settings_is_refused(model, data, tmp_path):
  inputs, targets = data
  cfg = training.TrainConfig(steps=3, batch_size=BATCH, checkpoint_every=3, seed=7, **OPT)
  training.train(on_device(model), inputs, targets, cfg, tmp_path, progress=False)
  other = dataclasses.replace(cfg, steps=6, optimizer="adafactor", learning_rate=0.02)
  with pytest.raises(training.TrainingError, match="learning_rate: 0.01 -> 0.02.*optimizer"):
    training.train(on_device(model), inputs, targets, other, tmp_path, progress=False)
  assert training.changed_settings(tmp_path, other) == ["learning_rate", "optimizer"]
  assert training.changed_settings(tmp_path, dataclasses.replace(cfg, steps=9)) == []


# ----------------------------------------------------------------------------- batch order


def test_batch_indices_deterministic_epoch_cover_and_seeded():
  n, bs = 22, 4
  per_epoch = n // bs
  epoch0 = [training.batch_indices(n, bs, seed=3, step=s) for s in range(per_epoch)]
  assert all(len(b) == bs for b in epoch0)
  flat = np.concatenate(epoch0)
  assert len(set(flat.tolist())) == len(flat) == per_epoch * bs       # no repeats
  assert set(flat.tolist()) <= set(range(n))
  # an exact multiple covers every example exactly once per epoch
  full = np.concatenate([training.batch_indices(20, 4, 0, s) for s in range(5)])
  assert sorted(full.tolist()) == list(range(20))
  # deterministic given (seed, step)
  for s in (0, 3, 11):
    np.testing.assert_array_equal(training.batch_indices(n, bs, 3, s),
                                  training.batch_indices(n, bs, 3, s))
  # the seed and the epoch change the order
  other_seed = np.concatenate([training.batch_indices(n, bs, 4, s) for s in range(per_epoch)])
  epoch1 = np.concatenate([training.batch_indices(n, bs, 3, s)
                           for s in range(per_epoch, 2 * per_epoch)])
  assert not np.array_equal(flat, other_seed)
  assert not np.array_equal(flat, epoch1)


def test_batches_start_step_matches_batch_indices(data):
  inputs, targets = data
  it = training.batches(inputs, targets, 8, seed=1, start_step=5)
  for step in (5, 6):
    b = next(it)
    np.testing.assert_array_equal(np.asarray(b["inputs"]),
                                  inputs[training.batch_indices(len(inputs), 8, 1, step)])


def test_length_buckets_group_lengths_cover_the_epoch_and_trim_only_padding():
  rng = np.random.default_rng(0)
  n, bs, width = 640, 8, 24
  inputs = np.zeros((n, width), np.int32)
  targets = np.zeros((n, width), np.int32)
  in_len, tgt_len = rng.integers(1, width + 1, n), rng.integers(1, width + 1, n)
  for i in range(n):
    inputs[i, :in_len[i]] = rng.integers(2, 50, in_len[i])
    targets[i, :tgt_len[i]] = rng.integers(2, 50, tgt_len[i])
  np.testing.assert_array_equal(training.token_lengths(inputs), in_len)
  lengths = np.maximum(in_len, tgt_len)
  per_epoch = n // bs
  epoch = [training.batch_indices(n, bs, 5, s, lengths, pool_batches=16)
           for s in range(per_epoch)]
  flat = np.concatenate(epoch)
  assert sorted(flat.tolist()) == list(range(n))                # every example once
  spread = np.mean([np.ptp(lengths[b]) for b in epoch])         # within-batch length spread
  plain = np.mean([np.ptp(lengths[training.batch_indices(n, bs, 5, s)])
                   for s in range(per_epoch)])
  assert spread < 0.35 * plain                                  # negative control: no buckets
  # a pure function of (seed, step): resuming at step 7 serves the same batch
  np.testing.assert_array_equal(epoch[7], training.batch_indices(n, bs, 5, 7, lengths, 16))

  it = training.batches(inputs, targets, bs, seed=5, start_step=0, length_bucket=4)
  widths = set()
  for step in range(per_epoch):
    b = next(it)
    idx = training.batch_indices(n, bs, 5, step, lengths)
    w = b["inputs"].shape[1]
    widths.add(w)
    assert w % 4 == 0 and w >= lengths[idx].max() > w - 4      # trimmed, rounded up to 4
    np.testing.assert_array_equal(np.asarray(b["inputs"]), inputs[idx, :w])
    np.testing.assert_array_equal(np.asarray(b["targets"]), targets[idx, :w])
  assert len(widths) > 2


@pytest.mark.slow
def test_trimmed_batch_has_the_same_loss(model, data):
  inputs, targets = data                       # rows are at most LENGTH - 1 tokens + EOS
  wide = batch_of(np.pad(inputs, ((0, 0), (0, 6))), np.pad(targets, ((0, 0), (0, 6))))
  assert loss_of(model.params, wide) == pytest.approx(
      loss_of(model.params, batch_of(inputs, targets)), rel=1e-5)


# ----------------------------------------------------------------------------- distillation


def kl_teacher_student(teacher, student, inputs, targets):
  """Mean over non-pad target positions of KL(teacher || student)."""
  dec = training.shift_right(jnp.asarray(targets))
  log_t = jax.nn.log_softmax(teacher.forward(inputs, dec), -1)
  log_s = jax.nn.log_softmax(student.forward(inputs, dec), -1)
  kl = jnp.sum(jnp.exp(log_t) * (log_t - log_s), -1)
  mask = targets > 0
  return float(jnp.sum(kl * mask) / mask.sum())


def test_distillation_moves_student_toward_teacher(model, data, tmp_path):
  inputs, targets = data
  # Another network (the student's params, shuffled along their first axis), with a
  # peaked output distribution.
  rng = np.random.default_rng(5)
  params = jax.tree_util.tree_map(lambda x: rng.permutation(np.asarray(x)), model.params)
  params["decoder"]["logits_dense"]["kernel"] = params["decoder"]["logits_dense"]["kernel"] * 8
  teacher = model.replace(params=params)
  before = kl_teacher_student(teacher, model, inputs, targets)
  cfg = training.TrainConfig(steps=30, batch_size=BATCH, checkpoint_every=30, **OPT)
  student, history = training.train(model, inputs, targets, cfg, tmp_path, teacher=teacher,
                                    progress=False)
  after = kl_teacher_student(teacher, student, inputs, targets)
  assert before > 0.5
  assert after < 0.6 * before, (before, after)
  assert history and np.isfinite(history[-1]["loss"])


# ----------------------------------------------------------------------------- shift_right


def test_shift_right():
  targets = jnp.array([[5, 6, 7, 1], [8, 1, 0, 0]], jnp.int32)
  np.testing.assert_array_equal(training.shift_right(targets),
                                [[0, 5, 6, 7], [0, 8, 1, 0]])
  np.testing.assert_array_equal(training.shift_right(targets, start_id=3),
                                [[3, 5, 6, 7], [3, 8, 1, 0]])
  out = training.shift_right(targets)
  assert out.shape == targets.shape and out.dtype == targets.dtype
  np.testing.assert_array_equal(training.shift_right(jnp.array([[9]])), [[0]])
