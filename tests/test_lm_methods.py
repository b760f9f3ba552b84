"""Decoding methods on decoder-only LMs, through the same engine and public API.

Every method's exactness on an LM is tests/test_exact.py's (the registry of methods on a
bfloat16 llama); here, what is particular to an LM's drafters and settings. Ragged,
right-padded prompts in one batch (one row a single token, one holding the EOS id as
content), a target sharpened so that EOS ends some rows: speculative greedy with n-gram,
prompt-lookup and early-exit drafters and adaptive gamma, and blockwise drafts (plain,
parallel, n-gram and neural rescored) equal the baseline's greedy output token for token;
speculative sampling keeps the target's distribution (exact enumeration, with its negative
control). (A ragged LM batch's rows equal the rows alone: tests/test_lm.py.)
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import peaked, perturbed
from test_distribution import (
  P_FAIL,
  P_PASS,
  V,
  WrongResidual,
  _all_sequences,
  _check_mask_margin,
  counts_of,
  gof_pvalue,
)

import specdec_jax as sd
from specdec_jax import cache as cache_lib
from specdec_jax import sampling as sampling_lib
from specdec_jax.drafters import lattice
from specdec_jax.drafters.heads import heads_loss

T = 12
LENGTHS = [7, 1, 4, 6]


@functools.lru_cache(maxsize=None)
def pair():
  """A llama-style target (GQA, rotary) made to end rows with EOS, a drafter near it."""
  target = peaked(sd.init_model(sd.get_config("llama_tiny"), 1), scale=4.0, eos_boost=2.0)
  return target, perturbed(target, 0.4, 7)


def prompts(vocab: int = 512, lengths=LENGTHS, width: int = 8, seed: int = 0) -> np.ndarray:
  """Right-padded prompts [B, width] (pad 0) of `lengths`; row 0 holds the EOS id (1)."""
  rng = np.random.default_rng(seed)
  out = np.zeros((len(lengths), width), np.int32)
  for b, n in enumerate(lengths):
    out[b, :n] = rng.integers(2, vocab, n)
  out[0, 2] = 1
  return out


@functools.lru_cache(maxsize=None)
def baseline():
  target, _ = pair()
  return sd.decode(target, sd.Autoregressive(), prompts(), max_new_tokens=T)


def assert_same(out, ref):
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))


def test_baseline_rows_are_ragged_and_some_end_with_eos():
  """The fixture exercises what the equivalences below must survive: EOS mid-row."""
  out = baseline()
  lengths = np.asarray(out.lengths)
  assert np.any(lengths < T) and np.any(lengths == T), lengths
  ended = np.flatnonzero(lengths < T)
  assert np.all(np.asarray(out.tokens)[ended, lengths[ended] - 1] == 1)


def ngram_drafter():
  """Bigram tables of the baseline's own outputs, the last prompt token leading each."""
  base, p = np.asarray(baseline().tokens), prompts()
  seqs = [np.concatenate([[p[b, n - 1]], base[b]]) for b, n in enumerate(LENGTHS)]
  return sd.NGramDrafter.fit(seqs, 512, start_id=None)


DRAFTERS = {
    "model-adaptive": lambda d: sd.Speculative(d, gamma=4, adaptive=True),
    "ngram": lambda d: sd.Speculative(ngram_drafter(), gamma=3),
    "prompt-lookup": lambda d: sd.Speculative(sd.PromptLookupDrafter(512), gamma=2),
    "early-exit": lambda d: sd.Speculative(sd.early_exit(pair()[0], 1), gamma=3),
}


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_speculative_greedy_equals_baseline(name):
  target, drafter = pair()
  out = sd.decode(target, DRAFTERS[name](drafter), prompts(), max_new_tokens=T)
  assert_same(out, baseline())
  if name != "prompt-lookup":       # drafts were accepted, and some rejected
    assert 0 < out.stats["alpha"] < 1, out.stats["alpha"]


def test_prompt_lookup_copies_from_the_prompt_within_its_length():
  """An LM's lookup matches suffixes that include the prompt's last token (seq[:, 0]) and
  copies only tokens inside the row's prompt, whatever the padding holds."""
  drafter = sd.PromptLookupDrafter(512)
  prompt = jnp.asarray([[7, 8, 9, 7, 8, 4],       # length 5: 7 8 9 7 8
                        [5, 6, 5, 6, 0, 0]])      # length 3: 5 6 5 (then 6 beyond it)
  state = drafter.init(prompt, 16, lengths=jnp.asarray([5, 3]))
  seq = jnp.asarray([[8, 0, 0], [5, 0, 0]])       # n = 0: only the last prompt token
  logits, state = drafter.first(state, seq, jnp.zeros((2,), jnp.int32))
  np.testing.assert_array_equal(np.asarray(state.pointer), [2, 1])   # 8 -> 9; 5 -> 6
  assert int(jnp.argmax(logits[0])) == 9 and int(jnp.argmax(logits[1])) == 6
  logits, state = drafter.next(state, jnp.asarray([9, 6]))
  np.testing.assert_array_equal(np.asarray(state.pointer), [3, 2])
  logits, state = drafter.next(state, jnp.asarray([7, 5]))
  assert int(jnp.argmax(logits[0])) == 8                # 9 7 -> 8, inside the prompt
  assert np.all(np.asarray(logits[1]) == 0)             # slot 3 is padding: no proposal


@pytest.mark.slow
@pytest.mark.parametrize("small", ["model", "early-exit"])
def test_bild_drafts_with_an_lm_small_model(small):
  """A decoder-only small model (or the target's first layer) drafts while confident; the
  large one verifies; rows end exactly at their EOS."""
  target, drafter = pair()
  small_model = drafter if small == "model" else sd.early_exit(target, 1)
  out = sd.decode(target, sd.BiLD(small_model, fallback_threshold=0.3), prompts(),
                  max_new_tokens=T)
  assert out.stats["drafter_tokens"] > 0
  np.testing.assert_array_equal(np.asarray(out.lengths) < T,
                                np.any(np.asarray(out.tokens) == 1, axis=1))


BLOCKWISE = {
    "plain": dict(),
    "parallel": dict(top_k=2, num_drafts=2),
    "ngram-rescored": dict(top_k=2, rescoring="ngram"),
    "neural-rescored": dict(top_k=2, rescoring="neural"),
}


@pytest.mark.parametrize("name", list(BLOCKWISE))
def test_blockwise_greedy_equals_baseline(name):
  target, _ = pair()
  heads = sd.init_heads(target, 3, rng=0)
  settings = dict(BLOCKWISE[name])
  if settings.get("rescoring") == "ngram":
    settings["rescorer"] = lattice.NGramLM.fit([np.asarray(baseline().tokens)[0]], 512)
  if settings.get("rescoring") == "neural":       # a decoder-only rescorer on the prompt
    settings["rescorer"] = pair()[1]
  out = sd.decode(target, sd.Blockwise(heads, oracle=name == "plain", **settings), prompts(),
                  max_new_tokens=T)
  assert_same(out, baseline())
  if name == "plain":      # the oracle's calls: at least one per round it could shorten
    oracle = np.asarray(out.counters.oracle_calls)
    assert np.all(oracle >= 1) and np.all(oracle <= np.asarray(out.lengths))


@pytest.mark.slow
def test_anchored_cache_counts_after_the_prompt():
  """`anchored` moves the prefill's length into the offset; decoding k tokens then equals
  decoding them unanchored, and `cache.move` copies slots counted after the offset."""
  target, _ = pair()
  p, lengths = jnp.asarray(prompts()), jnp.asarray(LENGTHS, jnp.int32)
  plain = target.start(p, 16, lengths)
  anchored = plain.anchored()
  np.testing.assert_array_equal(np.asarray(anchored.offset), np.asarray(lengths) - 1)
  np.testing.assert_array_equal(np.asarray(anchored.length), 0)
  tok = jnp.stack([target.first_tokens(p, lengths), jnp.full((4,), 9)], axis=1)
  a, plain = target.decode(tok, plain)
  b, anchored = target.decode(tok, anchored)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(np.asarray(anchored.length), 2)
  moved = cache_lib.move(anchored, jnp.full((4, 1), 1), jnp.full((4, 1), 2))
  rows = np.arange(4)
  slot = np.asarray(anchored.offset)
  key, new = np.asarray(anchored.self_key[0]), np.asarray(moved.self_key[0])
  np.testing.assert_array_equal(new[rows, :, slot + 2], key[rows, :, slot + 1])
  np.testing.assert_array_equal(new[rows, :, slot + 1], key[rows, :, slot + 1])
  with pytest.raises(sd.InputError, match="decoder-only caches"):
    t5 = sd.init_model(sd.get_config("t5_1_1_tiny"), 0)
    t5.start(jnp.asarray([[5, 6, 1]]), 4).anchored()


@pytest.mark.slow
def test_prompt_lengths_given_explicitly():
  """A prompt whose last token is the pad id needs prompt_lengths; with them the row is
  the same as when its prompt is stored with another pad id."""
  target, _ = pair()
  p = prompts()[:2].copy()
  p[0, 6] = 0                                  # the 7-token row now ends in the pad id
  lengths = np.asarray([7, 1], np.int32)
  out = sd.generate(target, p, max_new_tokens=T, prompt_lengths=lengths)
  np.testing.assert_array_equal(np.asarray(out.tokens)[1], np.asarray(baseline().tokens)[1])
  shorter = sd.generate(target, p, max_new_tokens=T)        # default: 6 tokens for row 0
  alone = sd.generate(target, p[:1, :7], max_new_tokens=T, prompt_lengths=np.asarray([7]))
  np.testing.assert_array_equal(np.asarray(out.tokens)[0], np.asarray(alone.tokens)[0])
  assert not np.array_equal(np.asarray(shorter.tokens)[0], np.asarray(out.tokens)[0])


@pytest.mark.slow
def test_learned_positions_up_to_the_table():
  """GPT-2 (learned positions): prompt + T fill the table exactly; the cache is capped at
  max_positions, and speculative greedy still equals the baseline."""
  gpt2 = sd.init_model(sd.get_config("gpt2_tiny"), 3)
  limit = gpt2.config.max_positions
  p = prompts(lengths=[20, 9], width=20)
  new = limit - p.shape[1]
  base = sd.generate(gpt2, p, max_new_tokens=new, eos_id=-1)
  spec = sd.speculative_generate(gpt2, perturbed(gpt2, 0.3, 1), p, gamma=4,
                                 max_new_tokens=new, eos_id=-1)
  assert_same(spec, base)
  assert np.all(np.asarray(base.lengths) == new)


# ----------------------------------------------------------------------------- sampling


@pytest.mark.slow
def test_generate_temperature_top_k_top_p():
  """Top-k 1 and a tiny top-p keep only the argmax: greedy output; temperature sampling
  is reproducible and leaves the argmax somewhere."""
  target, _ = pair()
  greedy = baseline()
  for setting in (sd.Sampling(temperature=1.0, top_k=1),
                  sd.Sampling(temperature=1.0, top_p=1e-6)):
    assert_same(sd.generate(target, prompts(), T, sampling=setting, rng=0), greedy)
  hot = sd.Sampling(temperature=2.0, top_k=50, top_p=0.95)
  a = sd.generate(target, prompts(), T, sampling=hot, rng=5)
  assert_same(a, sd.generate(target, prompts(), T, sampling=hot, rng=5))
  assert not np.array_equal(np.asarray(a.tokens), np.asarray(greedy.tokens))


# ----------------------------------------------------------------------------- distribution

PROMPT = np.array([[3, 5, 2]], np.int32)
ROWS = 10_000


@functools.lru_cache(maxsize=None)
def tiny_pair():
  """A V-token LM pair differing strongly (test_distribution's recipe for T5)."""
  config = sd.get_config("llama_tiny").replace(vocab_size=V, emb_dim=32, num_layers=1,
                                               num_heads=2, num_kv_heads=1, mlp_dim=64)

  def with_output(model, kernel):
    params = jax.tree_util.tree_map(lambda x: x, model.params)
    params["decoder"]["logits_dense"]["kernel"] = kernel
    return model.replace(params=params)

  target = sd.init_model(config, 0)
  kernel = target.params["decoder"]["logits_dense"]["kernel"]
  return with_output(target, kernel * 4.0), with_output(sd.init_model(config, 1), kernel * 1.5)


def lm_exact_probs(method, length: int) -> np.ndarray:
  """[V^L] the target's probability of every continuation of PROMPT: one causal pass."""
  target, _ = tiny_pair()
  seqs = _all_sequences(length)
  full = np.concatenate([np.repeat(PROMPT, len(seqs), 0), seqs], axis=1)
  logits = target.forward(jnp.asarray(full))[:, PROMPT.shape[1] - 1:-1]       # [N, L, V]
  _check_mask_margin(np.asarray(logits, np.float64), method)
  p = np.asarray(sampling_lib.probs(logits, method), np.float64)
  probs = np.take_along_axis(p, seqs[..., None], axis=-1)[..., 0].prod(axis=1)
  assert abs(probs.sum() - 1.0) < 1e-5
  return probs / probs.sum()


def lm_samples(method, gamma, length, seed, accept=None) -> np.ndarray:
  target, drafter = tiny_pair()
  rows = jnp.asarray(np.repeat(PROMPT, ROWS, axis=0))
  out = []
  for key in jax.random.split(jax.random.PRNGKey(seed), 2):
    o = sd.speculative_generate(target, drafter, rows, gamma=gamma, max_new_tokens=length,
                                sampling=method, rng=key, eos_id=-1, accept=accept)
    out.append(np.asarray(o.tokens))
  return np.concatenate(out)


@pytest.mark.slow
def test_speculative_sampling_keeps_the_lm_distribution():
  """Exact enumeration of every 3-token continuation: the speculative samples fit the
  target's distribution (p > 1e-3); the same samples with a wrong residual rule do not
  (p < 1e-6), on the same keys."""
  method, gamma, length = sd.Sampling(temperature=1.0), 3, 3
  probs = lm_exact_probs(method, length)
  right = lm_samples(method, gamma, length, seed=21)
  p_value, _, _ = gof_pvalue(counts_of(right), probs)
  assert p_value > P_PASS, p_value
  wrong = lm_samples(method, gamma, length, seed=21, accept=WrongResidual())
  p_wrong, _, _ = gof_pvalue(counts_of(wrong), probs)
  assert p_wrong < P_FAIL, p_wrong


# ----------------------------------------------------------------------------- heads, errors


@pytest.mark.slow
def test_heads_loss_on_an_lm():
  """Head 1's cross-entropy is the LM's own next-token loss over the real tokens; pad-id
  targets are not scored."""
  target, _ = pair()
  heads = sd.init_heads(target, 3, rng=0)
  text = jnp.asarray(prompts())
  _, per_head, _ = heads_loss(target, heads, None, text)
  logp = jax.nn.log_softmax(target.forward(text), -1)[:, :-1]
  nll = -jnp.take_along_axis(logp, text[:, 1:, None], -1)[..., 0]
  real = text[:, 1:] != 0
  np.testing.assert_allclose(per_head[0], jnp.sum(nll * real) / jnp.sum(real), rtol=1e-5)
  assert per_head.shape == (3,)
  with pytest.raises(sd.InputError, match="one token array"):
    heads_loss(target, heads, text, text)


@pytest.mark.slow
def test_heads_trained_on_an_lm_draft_accepted_tokens(tmp_path):
  """Heads fitted (frozen LM, optax adam) to the LM's own greedy continuations of the
  prompts: saved and loaded for it, their blockwise drafts are accepted (more than one
  token per call) and the output is still the baseline's."""
  import optax
  target, _ = pair()
  p = prompts()
  greedy = np.asarray(sd.generate(target, p, T, eos_id=-1).tokens)
  texts = np.zeros((len(LENGTHS), 8 + T), np.int32)      # each prompt, then its continuation
  for b, n in enumerate(LENGTHS):
    texts[b, :n + T] = np.concatenate([p[b, :n], greedy[b]])
  texts = jnp.asarray(texts)
  heads = sd.init_heads(target, 3, rng=1)
  opt = optax.adam(1e-2)

  @jax.jit
  def step(params, state):
    loss = lambda q: heads_loss(target, heads.replace(params=q), None, texts)[0]
    value, grads = jax.value_and_grad(loss)(params)
    updates, state = opt.update(grads, state)
    return optax.apply_updates(params, updates), state, value

  params, state = heads.params, opt.init(heads.params)
  values = []
  for _ in range(60):
    params, state, value = step(params, state)
    values.append(float(value))
  assert values[-1] < 0.3 * values[0], values[::10]
  sd.save_heads(tmp_path, heads.replace(params=params))
  trained = sd.load_heads(tmp_path, target)
  out = sd.decode(target, sd.Blockwise(trained), p, max_new_tokens=T, eos_id=-1)
  np.testing.assert_array_equal(np.asarray(out.tokens), greedy)
  assert out.stats["tokens_per_target_call"] > 1.5, out.stats["tokens_per_target_call"]


@pytest.mark.slow
def test_bad_inputs():
  target, _ = pair()
  t5 = sd.init_model(sd.get_config("t5_1_1_tiny").replace(vocab_size=512), 0)
  with pytest.raises(sd.InputError, match="drafter is a T5 encoder-decoder but the target is "
                                          "a decoder-only LM"):
    sd.decode(target, sd.Speculative(t5, gamma=2), prompts(), max_new_tokens=4)
  with pytest.raises(sd.InputError, match="drafter is a decoder-only LM but the target is a T5"):
    sd.decode(t5, sd.BiLD(target), np.array([[5, 6, 1]]), max_new_tokens=4)
  with pytest.raises(sd.InputError, match="prompt lengths must lie in"):
    sd.generate(target, prompts(), 4, prompt_lengths=np.asarray([9, 1, 1, 1]))
  with pytest.raises(sd.InputError, match="hold only the pad id"):
    sd.generate(target, np.zeros((2, 3), np.int32), 4)
  with pytest.raises(sd.InputError, match="prompt_lengths is for decoder-only"):
    sd.generate(t5, np.array([[5, 6, 1]]), 4, prompt_lengths=np.asarray([3]))
  gpt2 = sd.init_model(sd.get_config("gpt2_tiny"), 3)
  with pytest.raises(sd.InputError, match="exceed the model's 128 learned positions"):
    sd.generate(gpt2, prompts(), max_new_tokens=121)
  with pytest.raises(sd.InputError, match="continues the target's prompt"):
    sd.decode(target, sd.Speculative(pair()[1], drafter_inputs=prompts()), prompts(),
              max_new_tokens=4)
