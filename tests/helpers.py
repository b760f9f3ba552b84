"""Helpers the test modules share: paths, the demo's held-out pairs, random inputs, and
the builders of the decoding tests' models and fixtures (`model_fixtures`,
`workload_fixtures`), the T5X-written tiny model's session fixtures. Test modules import
them from here (`from helpers import ...`), the library's and the lab's tests alike; the
session fixtures are registered by importing them into a conftest.py.
"""

import contextlib
import json
import os
import pathlib
import sys
from collections.abc import Iterator

import jax
import numpy as np
import pytest
from flax import traverse_util

import specdec_jax as sd
from specdec_jax import testing

FIXTURE_DIR = pathlib.Path(__file__).parent / "fixtures" / "t5x_tiny_v1_1"
REPO_DIR = pathlib.Path(__file__).resolve().parent.parent
#: Held-out pairs ({"de": ..., "en": ...}) of the demo's test split (never trained on): the
#: JSONL file, its pairs, and the German sides of the first 8 (sentences).
DEMO_PAIRS_FILE = pathlib.Path(__file__).parent / "data" / "demo_test_pairs.jsonl"
DEMO_PAIRS = [json.loads(line) for line in DEMO_PAIRS_FILE.read_text().splitlines()]
DEMO_SENTENCES = [p["de"] for p in DEMO_PAIRS[:8]]

#: Prefix of a command that a test interrupts: `[*WITH_DEFAULT_SIGINT, "-m", ...]` runs
#: `python -m ...` with SIGINT's default action, as from a terminal. A shell starts its
#: background jobs with SIGINT ignored, an ignored signal stays ignored across exec, and
#: Python then installs no KeyboardInterrupt handler: a suite run in the background would
#: otherwise send SIGINTs that nothing receives.
WITH_DEFAULT_SIGINT = [sys.executable, "-c",
                       "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                       "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"]


#: The XLA_FLAGS conftest.py adds for compile speed: back-end optimization level
#: (`--xla_backend_optimization_level=N`) and XLA:CPU's older loop emitters. A child that
#: measures time or memory where compiles are few runs without them (`users_xla_env`).
OPT_LEVEL_FLAG = "--xla_backend_optimization_level"
EMITTERS_FLAG = "--xla_cpu_use_fusion_emitters"
LEGACY_EMITTERS = f"{EMITTERS_FLAG}=false"
SUITE_XLA_FLAGS = (OPT_LEVEL_FLAG, EMITTERS_FLAG)


def users_xla_env() -> dict[str, str]:
  """This process's environment with XLA_FLAGS less the suite's compile-speed flags: a
  child then compiles at XLA's own level, as users run (code compiled at level 0 runs up
  to 3x slower: fine for a compile-bound test, not for one that runs a few programs long)."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith(SUITE_XLA_FLAGS)]
  return dict(os.environ, XLA_FLAGS=" ".join(flags))


#: The `jax.monitoring` event jax records once per program it compiles for a backend (or loads
#: from the persistent compilation cache): a program the jit caches did not hold.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def compiles() -> Iterator[list[str]]:
  """The programs compiled inside the block, by name ("jit(_run)"), in order: a list that
  fills as they compile (a `jax.monitoring` listener on `BACKEND_COMPILE_EVENT`).

      with compiles() as programs:
        sd.generate(model, other_prompts, 5)
      assert programs == []        # new contents, same shapes: nothing compiled
  """
  programs: list[str] = []

  def listener(event: str, duration: float, **kwargs) -> None:
    if event == BACKEND_COMPILE_EVENT:
      programs.append(str(kwargs.get("fun_name", "?")))

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield programs
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def peaked(model: sd.Model, scale: float = 6.0, eos_boost: float = 2.0) -> sd.Model:
  """Sharpen a random model's output distribution and make EOS win sometimes."""
  params = jax.tree_util.tree_map(lambda x: x, model.params)
  kernel = params["decoder"]["logits_dense"]["kernel"] * scale
  params["decoder"]["logits_dense"]["kernel"] = kernel.at[:, 1].multiply(eos_boost)
  return model.replace(params=params)


def perturbed(model: sd.Model, noise: float, seed: int) -> sd.Model:
  """A drafter that agrees with `model` often but not always."""
  leaves, tree = jax.tree_util.tree_flatten(model.params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  leaves = [x + noise * jax.numpy.std(x) * jax.random.normal(k, x.shape)
            for x, k in zip(leaves, keys, strict=True)]
  return model.replace(params=jax.tree_util.tree_unflatten(tree, leaves))


def randomized_torch(model, seed: int, scale: float = 1.0):
  """A transformers model with every weight random (unit scale: transformers' 0.02 init makes
  near-ties of every logit, and a wrong name or a missing norm must change the logits), its
  norms and layer scalars near 1 and any `token_ordering` buffer a permutation (transformers
  initialises it to zeros, which the loader refuses); `scale` multiplies the weights. Eval mode."""
  import torch
  torch.manual_seed(seed)
  with torch.no_grad():
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
      if name.endswith("token_ordering"):
        p.copy_(torch.randperm(p.numel()))
      elif name.endswith(("norm.weight", "layer_scalar")):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      elif p.ndim == 2:
        p.copy_(torch.randn_like(p) * scale * (0.3 if "embed" in name else p.shape[-1] ** -0.5))
  return model.eval()


def ragged_tokens(batch: int, length: int, vocab: int, seed: int = 0) -> np.ndarray:
  """Random encoder inputs [B, L] with different lengths per row, EOS-terminated, 0-padded."""
  rng = np.random.RandomState(seed)
  tokens = np.zeros((batch, length), np.int32)
  for b in range(batch):
    n = length - (b * 3) % (length - 2)
    tokens[b, :n - 1] = rng.randint(2, vocab, n - 1)
    tokens[b, n - 1] = 1
  return tokens


#: Every method, by its name: the keys of the tests' registry (`testing.examples`, one
#: value per method type), what a test of "every method" parametrizes over.
METHOD_NAMES = tuple(testing.examples(None, "drafter", "heads"))

#: The arrays of a decode's output that exactness compares bitwise with its baseline's
#: (those the baseline has: a beam method's beams too).
OUTPUTS = ("tokens", "lengths", "beams")


def assert_same_output(out, base, name: str = "") -> None:
  """`out` is bitwise `base` in every array of `OUTPUTS` that `base` has; a beam method's
  scores to 1e-6 (speculative beam search sums a beam's log-probs from its verify call's
  wider log-softmax: equal to rounding, as tests/test_speculative_beam.py checks them)."""
  for field in OUTPUTS:
    if getattr(base, field, None) is not None:
      np.testing.assert_array_equal(np.asarray(getattr(out, field)),
                                    np.asarray(getattr(base, field)), err_msg=f"{name} {field}")
  if getattr(base, "scores", None) is not None:
    np.testing.assert_allclose(np.asarray(out.scores), np.asarray(base.scores), rtol=1e-6,
                               err_msg=f"{name} scores")


def every_method_at_natural_widths(target, methods: dict, name: str, enc, max_new_tokens: int,
                                   monkeypatch, baselines: dict) -> None:
  """A backend's end-to-end check of registry method `name` (`testing.examples`): on
  `target`, packed for a width-invariant backend, its greedy output is bitwise its
  baseline's while every call of the packed model carries its natural width (none padded
  to `EXACT_WIDTH`: the backend, not exact mode, makes the products width-invariant).
  `baselines` keeps each baseline's output ({method value: output}) across the calls of
  a module: a decode in interpret mode takes seconds."""
  from specdec_jax.rounds import engine
  assert target.width_invariant_decode
  widths = []

  def recording(original):
    def call(self, tokens, cache, **kwargs):
      if self.decode_weights is not None:
        widths.append(tokens.shape[1])
      return original(self, tokens, cache, **kwargs)
    return call

  for attr in ("decode", "decode_with_hidden"):       # the engine's calls, and Beam's
    monkeypatch.setattr(sd.Model, attr, recording(getattr(sd.Model, attr)))
  method = methods[name]
  out = sd.decode(target, method, enc, max_new_tokens=max_new_tokens)
  assert out.stats.get("exact", True), name
  assert widths and max(widths) < engine.EXACT_WIDTH, (name, sorted(set(widths)))
  if method.baseline() == method:
    baselines[method] = out
  if method.baseline() not in baselines:
    baselines[method.baseline()] = sd.decode(target, method.baseline(), enc,
                                             max_new_tokens=max_new_tokens)
  assert_same_output(out, baselines[method.baseline()], name)


# ----------------------------------------------------------------------------- shared models
# The decoding test modules build their models alike: the builders are here, and each module
# assigns the module-scoped fixtures they return under its own names, e.g.
#   target, drafter, heads = model_fixtures(5.0, 2.5, drafter="drafter", heads="heads")


def tiny_target(scale: float, eos_boost: float) -> sd.Model:
  """`t5_1_1_tiny` initialized with seed 1, `peaked(scale, eos_boost)`: the tests' target."""
  return peaked(sd.init_model(sd.get_config("t5_1_1_tiny"), 1), scale, eos_boost)


def model_fixtures(scale: float, eos_boost: float, target: str = "target",
                   drafter: str | None = None, heads: str | None = None) -> tuple:
  """Module-scoped fixtures named `target`: `tiny_target(scale, eos_boost)`; `drafter` (if
  named): that target `perturbed` (0.25, seed 3), which agrees with it often but not always;
  `heads` (if named): 3 random prediction heads on it (rng 2). Returned in that order."""

  @pytest.fixture(scope="module", name=target)
  def target_fixture():
    return tiny_target(scale, eos_boost)

  @pytest.fixture(scope="module", name=drafter)
  def drafter_fixture(request):
    return perturbed(request.getfixturevalue(target), 0.25, seed=3)

  @pytest.fixture(scope="module", name=heads)
  def heads_fixture(request):
    return sd.init_heads(request.getfixturevalue(target), 3, rng=2)

  return tuple(fixture for fixture, name in ((target_fixture, target),
                                             (drafter_fixture, drafter), (heads_fixture, heads))
               if name)


def workload_fixtures(max_new: int, target: str = "target", enc: str = "inputs",
                      baseline: str = "baseline") -> tuple:
  """Module-scoped fixtures of a greedy workload: `target`, `tiny_target(6.0, 3.0)`; `enc`,
  6 ragged inputs of up to 12 tokens (seed 1); `baseline`, the target's greedy output of
  `max_new` tokens at most, checked to exercise EOS at different times and the length cap.
  Returned in that order."""

  @pytest.fixture(scope="module", name=enc)
  def enc_fixture():
    return ragged_tokens(6, 12, 512, seed=1)

  @pytest.fixture(scope="module", name=baseline)
  def baseline_fixture(request):
    out = sd.generate(request.getfixturevalue(target), request.getfixturevalue(enc), max_new)
    lengths = np.asarray(out.lengths)
    assert len(set(lengths.tolist())) >= 3 and (lengths == max_new).any()
    return out

  return model_fixtures(6.0, 3.0, target) + (enc_fixture, baseline_fixture)


# ----------------------------------------------------------------------------- session fixtures
# The T5X-written tiny model: conftest.py imports these (and the lab's conftest.py).


@pytest.fixture(scope="session")
def t5x_reference():
  """reference.npz written by the real T5X code (see fixtures/t5x_tiny_v1_1/README.md)."""
  return dict(np.load(FIXTURE_DIR / "reference.npz"))


@pytest.fixture(scope="session")
def t5x_model(t5x_reference):
  """The fixture's params wrapped as our Model (independent of the checkpoint loaders)."""
  params = traverse_util.unflatten_dict(
      {tuple(k.split("/")): v for k, v in t5x_reference.items() if "/" in k})
  config = sd.T5Config.from_dict(json.loads((FIXTURE_DIR / "config.json").read_text()))
  return sd.Model(config=config, params=params)
