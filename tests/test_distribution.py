"""Statistical tests: speculative sampling preserves the target's output distribution.

Setup: tiny random T5 models with an 8-token vocabulary, so every continuation of
length L (8^2 = 64 or 8^3 = 512 sequences) can be enumerated. The exact probability
of each continuation comes from ONE teacher-forced `target.forward` over all of
them, with the same `sampling.log_probs` transform (temperature / top-k / top-p)
that the decoders apply: P(y_1..y_L) = prod_t p_t(y_t | y_<t).

Empirical counts come from >= 20,000 independent speculative samples of the same
encoder input: one call decodes a batch of identical rows (every row draws its own
uniforms / categoricals), repeated with a few different keys. A Pearson chi-square
goodness-of-fit test compares the counts with N * P (cells with an expected count
< 5 merged into one bin; any sample of a probability-0 sequence is an immediate
failure).

Threshold: the real sampler must give p > 1e-3. Under the null hypothesis the
p-value is uniform, so each check has a 0.1% false-alarm probability and the six
p-value checks of this file together < 1% (a looser 0.01 or 0.05 would make a false
alarm somewhere in the file likely); the seeds are fixed, so a passing run stays
passing on a given JAX version. A negative control (a deliberately wrong acceptance rule,
passed to `speculative_generate(accept=...)`) must give p < 1e-6 with the SAME test, which
shows the test has the power to see the errors it is meant to catch. Plain
autoregressive sampling of the target goes through the same check as a positive
control of the harness itself.

The drafter differs strongly from the target: a different random init (its whole
encoder / decoder body), with the target's output layer at a much flatter scale
(1.5 vs 4). Sequence-level total variation between the two models is ~0.85 (0.9 under
top-p), yet the acceptance rate is moderate (alpha ~ 0.5), so both the accept branch
and the residual branch run often.

Runtime is dominated by XLA compiling one speculative loop per (sampling, gamma,
max_new_tokens) — about 10 s each on CPU — not by sampling (20,000 samples ~ 2 s).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from specdec_jax import sampling as sampling_lib
from specdec_jax.config import get_config
from specdec_jax.methods import functional
from specdec_jax.models.model import init_model
from specdec_jax.rounds import stats as stats_lib
from specdec_jax.rounds.acceptance import SpeculativeSampling

V = 8
ENCODER_INPUT = np.array([[3, 5, 2, 7, 6, 1]], np.int32)   # one input, EOS-terminated
TARGET_SCALE = 4.0     # sharpens the target's output layer
DRAFTER_SCALE = 1.5    # the drafter's (transplanted) output layer is much flatter
N_SAMPLES = 20_000
ROWS_PER_CALL = 10_000  # identical rows per call; N_SAMPLES // ROWS_PER_CALL calls
P_PASS = 1e-3          # the real sampler must exceed this
P_FAIL = 1e-6          # the negative controls must fall below this

T1 = sampling_lib.Sampling(temperature=1.0)
TOPK3 = sampling_lib.Sampling(temperature=1.0, top_k=3)
T07P08 = sampling_lib.Sampling(temperature=0.7, top_p=0.8)

# (id, sampling, gamma, max_new_tokens, seed). gamma=3 with L=3: several drafts per round and
# emission cut by max_new_tokens; gamma=1 with L=3: L is not a multiple of gamma + 1, so
# rounds straddle the cap; gamma=3 with L=2: gamma > L.
CASES = [
    ("t1.0-g3-L3", T1, 3, 3, 101),
    ("topk3-g3-L2", TOPK3, 3, 2, 103),
    ("t0.7-topp0.8-g1-L3", T07P08, 1, 3, 104),
]

REPORT: dict[str, str] = {}   # printed by the tests (pytest -s) for the record


# ----------------------------------------------------------------------------- models


def _with_output_layer(model, kernel):
  params = jax.tree_util.tree_map(lambda x: x, model.params)
  params["decoder"]["logits_dense"]["kernel"] = kernel
  return model.replace(params=params)


@functools.lru_cache(maxsize=None)
def models():
  base = get_config("t5_1_1_tiny").replace(
      vocab_size=V, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64,
      num_encoder_layers=1, num_decoder_layers=1)
  target = init_model(base, 0)
  kernel = target.params["decoder"]["logits_dense"]["kernel"]
  target = _with_output_layer(target, kernel * TARGET_SCALE)
  drafter = init_model(base, 1)
  drafter = _with_output_layer(drafter, kernel * DRAFTER_SCALE)
  return target, drafter


# ----------------------------------------------------------------------------- exact probabilities


def _all_sequences(length: int) -> np.ndarray:
  """[V^L, L] every continuation, in base-V order (first token most significant)."""
  return np.array(list(itertools.product(range(V), repeat=length)), np.int32)


def sequence_index(tokens: np.ndarray) -> np.ndarray:
  """[N, L] tokens -> [N] index into `_all_sequences(L)`."""
  length = tokens.shape[1]
  return (tokens.astype(np.int64) * V ** np.arange(length - 1, -1, -1)).sum(axis=1)


def _teacher_forced(model, length: int, method):
  """Per-position adjusted distributions along every continuation: [V^L, L, V] float64.

  Row s, position t is p_t(. | s_<t); the decoder input is [start, s_1..s_{L-1}].
  """
  seqs = _all_sequences(length)
  dec_in = np.concatenate([np.zeros((len(seqs), 1), np.int32), seqs[:, :-1]], axis=1)
  enc = np.repeat(ENCODER_INPUT, len(seqs), axis=0)
  logits = model.forward(jnp.asarray(enc), jnp.asarray(dec_in))
  return seqs, logits, np.asarray(sampling_lib.probs(logits, method), np.float64)


@functools.lru_cache(maxsize=None)
def exact_probs(method, length: int) -> np.ndarray:
  """[V^L] exact target probability of every continuation under `method`."""
  target, _ = models()
  seqs, logits, p = _teacher_forced(target, length, method)
  _check_mask_margin(np.asarray(logits, np.float64), method)
  per_token = np.take_along_axis(p, seqs[..., None], axis=-1)[..., 0]
  probs = per_token.prod(axis=1)
  assert abs(probs.sum() - 1.0) < 1e-5
  return probs / probs.sum()


def _check_mask_margin(logits: np.ndarray, method) -> None:
  """Precondition: no top-k / top-p boundary is within float noise of flipping.

  The decoders compute logits through the KV cache, this file through a full forward
  pass; they agree to ~1e-6, which must not change which tokens a mask keeps.
  """
  scaled = logits / method.temperature
  if method.top_k:
    top = -np.sort(-scaled, axis=-1)
    assert np.min(top[..., method.top_k - 1] - top[..., method.top_k]) > 1e-3
  if method.top_p < 1.0:
    z = np.exp(scaled - scaled.max(-1, keepdims=True))
    desc = -np.sort(-(z / z.sum(-1, keepdims=True)), axis=-1)
    mass_before = np.cumsum(desc, axis=-1) - desc
    assert np.min(np.abs(mass_before - method.top_p)) > 1e-4


# ----------------------------------------------------------------------------- the test statistic


def gof_pvalue(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int, float]:
  """Pearson chi-square goodness of fit of `counts` [K] against `probs` [K].

  Any count in a probability-0 cell gives p = 0. Cells with expected count < 5 are
  merged into one bin (grown with the next-smallest cells until it reaches 5).
  Returns (p-value, number of bins, chi-square statistic).
  """
  n = counts.sum()
  if counts[probs <= 0].sum() > 0:
    return 0.0, 0, float("inf")
  keep = probs > 0
  counts, expected = counts[keep].astype(np.float64), n * probs[keep]
  order = np.argsort(expected)
  counts, expected = counts[order], expected[order]
  rare = int(np.sum(expected < 5))
  if rare:
    while rare < len(expected) and expected[:rare].sum() < 5:
      rare += 1
    counts = np.concatenate([[counts[:rare].sum()], counts[rare:]])
    expected = np.concatenate([[expected[:rare].sum()], expected[rare:]])
  assert len(expected) >= 2
  stat, p = sps.chisquare(counts, expected)
  return float(p), len(expected), float(stat)


def counts_of(tokens: np.ndarray) -> np.ndarray:
  length = tokens.shape[1]
  return np.bincount(sequence_index(tokens), minlength=V ** length)


# ----------------------------------------------------------------------------- samplers


def speculative_samples(method, gamma: int, length: int, seed: int, n: int = N_SAMPLES,
                        eos_id: int = -1, accept=None, lenience: float = 1.0):
  """n speculative samples of ENCODER_INPUT: (tokens [n, L], list of stats per call).

  With the default eos_id=-1 no row stops early: every sample has exactly L tokens.
  """
  target, drafter = models()
  enc = jnp.asarray(np.repeat(ENCODER_INPUT, ROWS_PER_CALL, axis=0))
  tokens, stats = [], []
  for key in jax.random.split(jax.random.PRNGKey(seed), n // ROWS_PER_CALL):
    out = functional.speculative_generate(target, drafter, enc, gamma=gamma,
                                          max_new_tokens=length, sampling=method, rng=key,
                                          eos_id=eos_id, accept=accept, lenience=lenience)
    np.testing.assert_array_equal(out.lengths, _lengths(np.asarray(out.tokens), eos_id))
    tokens.append(np.asarray(out.tokens))
    raw = stats_lib.summarize(out.counters, dict(out.info), raw=True)   # per-row values too
    stats.append(jax.tree_util.tree_map(np.asarray, raw))
  return np.concatenate(tokens), stats


def _lengths(tokens: np.ndarray, eos_id: int) -> np.ndarray:
  """Tokens up to and including the first EOS (all of them without one)."""
  is_eos = tokens == eos_id
  return np.where(is_eos.any(axis=1), np.argmax(is_eos, axis=1) + 1, tokens.shape[1])


def truncate_at_eos(seqs: np.ndarray, eos_id: int) -> np.ndarray:
  """What a decoder outputs for the full continuation `seqs`: zeros after the first EOS."""
  after = np.arange(seqs.shape[1])[None, :] >= _lengths(seqs, eos_id)[:, None]
  return np.where(after, 0, seqs)


def autoregressive_samples(method, length: int, seed: int, n: int = N_SAMPLES):
  target, _ = models()
  enc = jnp.asarray(np.repeat(ENCODER_INPUT, ROWS_PER_CALL, axis=0))
  tokens = []
  for key in jax.random.split(jax.random.PRNGKey(seed), n // ROWS_PER_CALL):
    out = functional.generate(target, enc, max_new_tokens=length, sampling=method, rng=key,
                                  eos_id=-1)
    assert np.all(np.asarray(out.lengths) == length)
    tokens.append(np.asarray(out.tokens))
  return np.concatenate(tokens)


def _record(name: str, text: str) -> None:
  REPORT[name] = text
  print(f"\n[distribution] {name}: {text}")


# ----------------------------------------------------------------------------- tests


@pytest.mark.slow
def test_models_are_peaked_and_differ_strongly():
  """The setup is meaningful: peaked target, very different drafter, moderate alpha."""
  target, drafter = models()
  _, _, p = _teacher_forced(target, 3, T1)
  _, _, q = _teacher_forced(drafter, 3, T1)
  seq_p, seq_q = exact_probs(T1, 3), np.prod(
      np.take_along_axis(q, _all_sequences(3)[..., None], -1)[..., 0], axis=1)
  assert p[0, 0].max() > 0.4                          # peaked next-token distributions
  assert 0.5 * np.abs(seq_p - seq_q).sum() > 0.6      # sequence-level total variation
  # Expected beta = sum_x min(p, q) along target samples: neither ~0 nor ~1.
  beta = np.minimum(p, q).sum(-1)                    # [V^3, 3]
  alpha = float(np.mean(seq_p @ beta))
  assert 0.3 < alpha < 0.8
  _record("setup", f"alpha(T=1)={alpha:.3f}, seq TV(p,q)="
          f"{0.5 * np.abs(seq_p - seq_q).sum():.3f}, max p_1={p[0, 0].max():.3f}")


@pytest.mark.slow
@pytest.mark.parametrize("name,method,gamma,length,seed", CASES, ids=[c[0] for c in CASES])
def test_speculative_matches_target_distribution(name, method, gamma, length, seed):
  probs = exact_probs(method, length)
  tokens, stats = speculative_samples(method, gamma, length, seed=seed)
  assert len(tokens) >= 20_000
  p_value, bins, chi2 = gof_pvalue(counts_of(tokens), probs)
  acc = float(np.mean([s["acceptance_rate"] for s in stats]))
  rounds = float(np.mean([np.mean(s["target_calls_per_row"]) for s in stats]))
  _record(name, f"N={len(tokens)}, support={int((probs > 0).sum())}, bins={bins}, "
          f"chi2={chi2:.1f}, p={p_value:.3g}, acceptance={acc:.3f}, "
          f"target calls/row={rounds:.2f}")
  # Both branches of the rejection rule ran often.
  assert 0.15 < acc < 0.85
  assert p_value > P_PASS, f"{name}: chi-square p-value {p_value:.3g} <= {P_PASS}"


@pytest.mark.slow
def test_rows_are_independent():
  """Identical rows of one call draw independent randomness, and keys differ across calls."""
  tokens, _ = speculative_samples(T1, 3, 3, seed=7, n=2 * ROWS_PER_CALL)
  first, second = tokens[:ROWS_PER_CALL], tokens[ROWS_PER_CALL:]
  assert len(np.unique(sequence_index(first))) > 50
  assert not np.array_equal(first, second)
  # Neighbouring rows: the first token of row 2i and of row 2i+1 are independent.
  table = np.zeros((V, V), np.int64)
  np.add.at(table, (first[0::2, 0], first[1::2, 0]), 1)
  table = table[table.sum(1) > 0][:, table.sum(0) > 0]
  p_value = sps.chi2_contingency(table)[1]
  _record("row independence", f"contingency p={p_value:.3g}, "
          f"distinct sequences in one call={len(np.unique(sequence_index(first)))}")
  assert p_value > P_PASS


@pytest.mark.slow
def test_autoregressive_positive_control():
  """The harness passes plain target sampling (same transform, same test)."""
  results = []
  for method, length in [(T1, 3)]:
    tokens = autoregressive_samples(method, length, seed=5)
    p_value, bins, chi2 = gof_pvalue(counts_of(tokens), exact_probs(method, length))
    results.append(p_value)
    _record(f"autoregressive {method} L={length}", f"N={len(tokens)}, bins={bins}, "
            f"p={p_value:.3g}")
  assert min(results) > P_PASS


@pytest.mark.slow
def test_eos_inside_drafts_preserves_distribution():
  """A live EOS (token 7, ends ~20% of sequences early, also inside accepted drafts).

  The output of a full continuation is its prefix up to EOS, zero-padded; its exact
  probability is the sum of P over the full continuations that map to it (what follows
  an EOS sums to 1 under teacher forcing).
  """
  method, gamma, length, eos_id = T1, 2, 3, 7
  seqs = _all_sequences(length)
  probs = np.bincount(sequence_index(truncate_at_eos(seqs, eos_id)),
                      weights=exact_probs(method, length), minlength=V ** length)
  tokens, _ = speculative_samples(method, gamma, length, seed=21, eos_id=eos_id)
  lengths = _lengths(tokens, eos_id)
  p_value, bins, chi2 = gof_pvalue(counts_of(tokens), probs)
  _record("eos=7 t1.0-g2-L3", f"N={len(tokens)}, support={int((probs > 0).sum())}, "
          f"bins={bins}, chi2={chi2:.1f}, p={p_value:.3g}, "
          f"ended early={np.mean(lengths < length):.3f}")
  assert 0.1 < np.mean(lengths < length) < 0.5
  assert p_value > P_PASS


# ----------------------------------------------------------------------------- negative controls


@dataclasses.dataclass(frozen=True)
class WrongResidual(SpeculativeSampling):
  """WRONG: the usual acceptance test, but after a rejection t ~ p_{m+1}, not the residual."""

  def __call__(self, logits, proposal, sampling, key):
    right = SpeculativeSampling()(logits, proposal, sampling, key)
    p_next = jnp.take_along_axis(sampling_lib.probs(logits, sampling),
                                 right.m[:, None, None], axis=1)[:, 0]
    next_token = jax.random.categorical(jax.random.split(key)[1], jnp.log(p_next), axis=-1)
    return right.replace(next_token=next_token.astype(jnp.int32))


@dataclasses.dataclass(frozen=True)
class AcceptAll(SpeculativeSampling):
  """WRONG: every draft accepted (the output is the drafter's samples), bonus t ~ p. The
  negative control of the drafters' own statistical tests (blockwise heads, the Gemma 4
  assistant); this file's is the subtler `WrongResidual`."""

  def __call__(self, logits, proposal, sampling, key):
    right = SpeculativeSampling()(logits, proposal, sampling, key)
    m = proposal.count
    p_next = jnp.take_along_axis(sampling_lib.probs(logits, sampling), m[:, None, None],
                                 axis=1)[:, 0]
    next_token = jax.random.categorical(key, jnp.log(p_next), axis=-1).astype(jnp.int32)
    return right.replace(m=m, next_token=next_token)


@pytest.mark.slow
def test_negative_control_fails():
  """The same test, with a wrong rule passed as an argument (the residual replaced by p),
  must fail decisively."""
  wrong = WrongResidual()
  method, gamma, length = T1, 3, 3
  probs = exact_probs(method, length)
  reference, _ = speculative_samples(method, gamma, length, seed=11)
  tokens, _ = speculative_samples(method, gamma, length, seed=11, accept=wrong)
  differing = float(np.mean(np.any(tokens != reference, axis=1)))
  assert differing > 0.05                       # same keys, other rule, other samples
  p_value, bins, chi2 = gof_pvalue(counts_of(tokens), probs)
  _record(f"negative control {type(wrong).__name__}", f"N={len(tokens)}, bins={bins}, "
          f"chi2={chi2:.0f} (dof {bins - 1}), p={p_value:.3g}, "
          f"rows differing from the correct rule with the same keys={differing:.3f}")
  assert p_value < P_FAIL


@pytest.mark.slow
def test_lenient_sampling_is_lossy_and_labelled():
  """lenience < 1 (Leviathan et al. A.5) accepts more drafts and no longer samples the
  target's distribution: the same goodness-of-fit test that the exact rule passes fails."""
  method, gamma, length = T1, 3, 3
  probs = exact_probs(method, length)
  _, exact_stats = speculative_samples(method, gamma, length, seed=13)
  tokens, stats = speculative_samples(method, gamma, length, seed=13, lenience=0.2)
  assert all(bool(s["lossy"]) for s in stats) and not bool(exact_stats[0]["lossy"])
  exact_acc = float(np.mean([s["acceptance_rate"] for s in exact_stats]))
  lenient_acc = float(np.mean([s["acceptance_rate"] for s in stats]))
  p_value, bins, chi2 = gof_pvalue(counts_of(tokens), probs)
  _record("lenience 0.2", f"N={len(tokens)}, acceptance {exact_acc:.3f} -> {lenient_acc:.3f}, "
          f"chi2={chi2:.0f} (dof {bins - 1}), p={p_value:.3g}")
  assert lenient_acc > exact_acc + 0.1
  assert p_value < P_FAIL


@pytest.mark.slow
def test_rule_passed_as_argument_is_the_one_used():
  """Passing the exact rule explicitly reproduces the default: same keys, same samples."""
  a, _ = speculative_samples(T1, 3, 3, seed=11, n=ROWS_PER_CALL)
  b, _ = speculative_samples(T1, 3, 3, seed=11, n=ROWS_PER_CALL, accept=SpeculativeSampling())
  np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------- acceptance statistics


@pytest.mark.slow
def test_first_round_acceptance_matches_exact_theory():
  """max_new_tokens=1 stops after ONE round; its acceptance statistics are exactly computable.

  With a_j = min(p_j, q_j)(x_j) along a draft x_1..x_gamma (both teacher forced):
    P(m > i) = sum over x_1..x_{i+1} of prod_{j<=i+1} a_j,
    E[beta_sum] = sum_i E[1(m >= i) beta_{i+1}],  E[beta_count] = sum_{i<gamma} P(m >= i).
  """
  method, gamma = T1, 3
  target, drafter = models()
  seqs, _, p = _teacher_forced(target, gamma, method)
  _, _, q = _teacher_forced(drafter, gamma, method)
  a = np.take_along_axis(np.minimum(p, q), seqs[..., None], axis=-1)[..., 0]   # [V^g, g]
  beta = np.minimum(p, q).sum(-1)                                               # [V^g, g]
  # a[:, j] and beta[:, j] depend on the prefix x_1..x_j only; a prefix of length k is
  # shared by V^(gamma - k) rows of `seqs`, so a sum over prefixes divides by that.
  p_m_gt = np.array([np.sum(np.prod(a[:, :i + 1], axis=1)) / V ** (gamma - i - 1)
                     for i in range(gamma)])                                   # P(m > i)
  beta_sum = sum(np.sum(np.prod(a[:, :i], axis=1) * beta[:, i]) / V ** (gamma - i)
                 for i in range(gamma))
  beta_count = 1.0 + p_m_gt[:gamma - 1].sum()
  alpha_exact = beta_sum / beta_count

  tokens, stats = speculative_samples(method, gamma, 1, seed=3)
  n = len(tokens)
  per_pos = np.concatenate([s["per_position_accepted_per_row"] for s in stats])   # [n, g]
  measured = per_pos.mean(axis=0)
  z = (measured - p_m_gt) / np.sqrt(p_m_gt * (1 - p_m_gt) / n)
  # In one round a row scores min(m + 1, gamma) positions; stats["alpha"] is
  # sum(beta_sum) / sum(beta_count), a ratio of means (delta-method standard error).
  counts = np.concatenate([np.minimum(s["accepted_per_row"] + 1, gamma) for s in stats])
  sums = np.concatenate([s["alpha_per_row"] * np.minimum(s["accepted_per_row"] + 1, gamma)
                         for s in stats])
  for s in stats:   # the reported alpha is that ratio
    c = np.minimum(s["accepted_per_row"] + 1, gamma)
    np.testing.assert_allclose(s["alpha"], np.sum(s["alpha_per_row"] * c) / np.sum(c),
                               rtol=1e-4)
  alpha_measured = float(sums.sum() / counts.sum())
  se_alpha = np.std(sums - alpha_exact * counts) / np.mean(counts) / np.sqrt(n)
  z_alpha = (alpha_measured - alpha_exact) / se_alpha
  _record("first-round acceptance", f"N={n}, P(m>i) exact={np.round(p_m_gt, 4).tolist()} "
          f"measured={np.round(measured, 4).tolist()}, alpha exact={alpha_exact:.4f} "
          f"measured={alpha_measured:.4f} (z={z_alpha:.2f})")
  assert np.all(np.abs(z) < 4.5), z
  assert abs(z_alpha) < 4.5
  assert abs(alpha_measured - alpha_exact) < 0.02
