"""The T5X side-by-side benchmark's checks (the timing itself needs a T5X checkout and
runs in scripts/compare_t5x.py)."""

import subprocess
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import REPO_DIR

from specdec_jax_lab import t5x_bench

SCRIPT = REPO_DIR / "scripts" / "compare_t5x.py"


def test_missing_t5x_checkout_is_a_clear_error(tmp_path):
  (tmp_path / "t5x").mkdir()
  (tmp_path / "t5x" / "decoding.py").write_text("")
  with pytest.raises(t5x_bench.T5XSourceError, match="binary_search.py.*network.py"):
    t5x_bench.load_t5x(tmp_path)


def test_compare_script_reports_a_missing_checkout(tmp_path):
  proc = subprocess.run([sys.executable, str(SCRIPT), "--t5x-src",
                         str(tmp_path / "nowhere"), "--model", "config:t5_1_1_tiny",
                         "--out", str(tmp_path / "out")], capture_output=True, text=True)
  assert proc.returncode == 2
  assert "not a T5X source checkout" in proc.stderr and "Traceback" not in proc.stderr


def test_compare_script_reports_a_missing_model(tmp_path, capsys):
  """In this process (the script as a process: test_compare_script_reports_a_missing_checkout)."""
  src = tmp_path / "t5x_src"
  for rel in t5x_bench.T5X_FILES:   # present but empty: the model is what is missing
    (src / rel).parent.mkdir(parents=True, exist_ok=True)
    (src / rel).write_text("")
  code = _load_script().main(["--t5x-src", str(src), "--model",
                              str(tmp_path / "no_such_checkpoint"), "--out", str(tmp_path / "out")])
  err = capsys.readouterr().err
  assert code == 2, err
  assert "no_such_checkpoint" in err and "Traceback" not in err


# --- dtype and token agreement (no T5X checkout needed) ------------------------------


class _FakeNetwork:
  """Stands in for `t5x.examples.t5.network`: records the config it is built with."""

  @staticmethod
  def T5Config(**kwargs):
    return dict(kwargs)

  @staticmethod
  def Transformer(cfg):
    return ("Transformer", cfg)


def _fake_model(dtype):
  import specdec_jax as sd
  return types.SimpleNamespace(config=sd.get_config("t5_1_1_tiny").replace(dtype=dtype))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_t5x_network_runs_our_compute_dtype(dtype):
  kind, cfg = t5x_bench.t5x_network(types.SimpleNamespace(network=_FakeNetwork),
                                    _fake_model(dtype))
  assert kind == "Transformer"
  assert cfg["dtype"] == jnp.dtype(dtype)
  assert cfg["float32_attention_logits"] is True     # as ours, whatever the dtype
  c = _fake_model(dtype).config
  assert cfg["dropout_rate"] == 0.0 and cfg["vocab_size"] == c.vocab_size
  assert cfg["num_heads"] == c.num_heads and cfg["mlp_activations"] == tuple(c.mlp_activations)


def test_t5x_network_refuses_float16():
  with pytest.raises(t5x_bench.CompareError, match="float32 or bfloat16, not float16"):
    t5x_bench.t5x_network(types.SimpleNamespace(network=_FakeNetwork), _fake_model("float16"))


def test_run_t5x_compare_refuses_other_dtypes_before_any_work():
  model = _fake_model("float32")
  with pytest.raises(t5x_bench.CompareError, match="not float16"):
    t5x_bench.run_t5x_compare(model, None, t5x_bench.T5XTiming(progress=False),
                              dtype="float16")


def test_token_agreement_on_hand_made_rows():
  t5x = np.array([[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8]])
  ours = np.array([[1, 2, 3, 4], [1, 9, 3, 4], [0, 6, 7, 8]])
  a = t5x_bench.token_agreement(t5x, ours)
  assert a == {"fraction": 10 / 12, "identical_rows": 1, "rows": 3,
               "first_divergence": [None, 1, 0]}
  assert t5x_bench.token_agreement(t5x, t5x)["first_divergence"] == [None] * 3
  with pytest.raises(t5x_bench.CompareError, match="must both be"):
    t5x_bench.token_agreement(t5x, ours[:, :3])


def test_float32_requires_identical_tokens_bfloat16_reports():
  a = t5x_bench.token_agreement([[1, 2, 3]], [[1, 2, 4]])
  with pytest.raises(t5x_bench.CompareError, match="batch 1: float32.*1 of 1 rows"):
    t5x_bench.check_agreement("float32", 1, a)
  t5x_bench.check_agreement("bfloat16", 1, a)      # reported, not an error
  t5x_bench.check_agreement("float32", 1, t5x_bench.token_agreement([[1, 2]], [[1, 2]]))


def _results(dtype, agreement):
  row = {"batch": 2, "t5x_ms_per_token": 2.0, "ours_ms_per_token": 1.0, "ratio": 0.5,
         "round_ratios": [0.5, 0.5], "agreement": agreement,
         "identical_tokens": agreement["identical_rows"] == agreement["rows"]}
  return {"model": {"num_params": 77e6}, "dtype": dtype, "prompt_len": 32, "steps": 4,
          "repeats": 2, "rows": [row]}


def test_markdown_names_the_dtype_and_the_agreement():
  same = t5x_bench.token_agreement([[1, 2, 3, 4]] * 2, [[1, 2, 3, 4]] * 2)
  text = t5x_bench.markdown(_results("float32", same))
  assert "float32 params" in text and "greedy tokens identical" in text
  assert "| 2 | 2.00 | 1.00 | 0.50 | 100.0% | 2/2 | –, – |" in text
  split = t5x_bench.token_agreement([[1, 2, 3, 4]] * 2, [[1, 2, 3, 4], [1, 2, 0, 0]])
  text = t5x_bench.markdown(_results("bfloat16", split))
  assert "bfloat16 params" in text and "greedy tokens identical" not in text
  assert "not required identical" in text
  assert "| 75.0% | 1/2 | –, 2 |" in text


def test_compare_script_rejects_an_unknown_dtype(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:     # argparse's usage error, in this process
    _load_script().main(["--t5x-src", str(tmp_path), "--dtype", "float16"])
  err = capsys.readouterr().err
  assert e.value.code == 2
  assert "--dtype" in err and "float16" in err
  assert "Traceback" not in err


def test_compare_script_passes_the_dtype_through(monkeypatch, tmp_path):
  """--dtype reaches both the loader and the comparison (no T5X: both stubbed)."""
  import importlib.util

  from specdec_jax import loading as models
  spec = importlib.util.spec_from_file_location("compare_t5x", SCRIPT)
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  seen = {}
  monkeypatch.setattr(t5x_bench, "load_t5x", lambda src: "t5x")
  monkeypatch.setattr(models, "load_model", lambda spec, dtype="float32": seen.setdefault(
      "load", dtype))

  def fake_compare(model, t5x, timing, **kw):
    seen["compare"] = kw["dtype"]
    seen["timing"] = timing
    raise t5x_bench.CompareError("stop here")
  monkeypatch.setattr(t5x_bench, "run_t5x_compare", fake_compare)
  assert script.main(["--t5x-src", "x", "--dtype", "bfloat16", "--out", str(tmp_path)]) == 2
  assert seen.pop("timing") == t5x_bench.T5XTiming(batch_sizes=[1, 8], prompt_len=32, steps=32,
                                                   repeats=7)
  assert seen == {"load": "bfloat16", "compare": "bfloat16"}


def test_bfloat16_compare_model_computes_in_bfloat16():
  """load_model's config: models cast only the params; the comparison also needs
  bfloat16 activations (what sd.load(dtype="bfloat16") gives)."""
  import jax

  from specdec_jax.loading import load_model
  loaded = load_model("config:t5_1_1_tiny", "bfloat16")
  model = t5x_bench._compare_model(loaded, "bfloat16")
  assert model.config.dtype == "bfloat16"
  assert {x.dtype for x in jax.tree_util.tree_leaves(model.params)} == {jnp.dtype("bfloat16")}
  f32 = load_model("config:t5_1_1_tiny", "float32")
  assert t5x_bench._compare_model(f32, None) is f32       # float32: today's model, untouched


def _load_script():
  import importlib.util
  spec = importlib.util.spec_from_file_location("compare_t5x", SCRIPT)
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  return script


def test_compare_script_drafter_needs_beam_and_reaches_the_comparison(monkeypatch, tmp_path):
  """--drafter compares T5X's beam search with experimental.SpeculativeBeam: refused without --beam
  (usage, exit 2); with it, the drafter and --gamma reach `run_t5x_compare`."""
  from specdec_jax import loading as models
  script = _load_script()
  with pytest.raises(SystemExit) as e:
    script.main(["--t5x-src", "x", "--drafter", "config:t5_1_1_tiny"])
  assert e.value.code == 2
  seen = {}
  monkeypatch.setattr(t5x_bench, "load_t5x", lambda src: "t5x")
  monkeypatch.setattr(models, "load_model", lambda spec, dtype="float32": spec)

  def fake_compare(model, t5x, timing, **kw):
    seen.update(kw, model=model)
    raise t5x_bench.CompareError("stop here")
  monkeypatch.setattr(t5x_bench, "run_t5x_compare", fake_compare)
  assert script.main(["--t5x-src", "x", "--model", "m", "--beam", "2:0.5", "--drafter", "d",
                      "--gamma", "4", "--out", str(tmp_path)]) == 2
  assert seen == {"model": "m", "dtype": "float32", "beam": (2, 0.5), "drafter": "d",
                  "gamma": 4}


@pytest.mark.slow
def test_speculative_beam_side_is_compared_beam_for_beam(monkeypatch):
  """`run_t5x_compare(beam=, drafter=)` on a tiny model, T5X's side stood in by `sd.Beam`
  (the real T5X needs a checkout; `sd.Beam` is bitwise T5X's, tests/test_beam.py): every
  beam of ours (experimental.SpeculativeBeam, the target drafting itself) equals it, and the rows
  record the beam steps per target call."""
  import specdec_jax as sd
  model = sd.load("config:t5_1_1_tiny")
  monkeypatch.setattr(t5x_bench, "t5x_network", lambda t5x, model: None)
  monkeypatch.setattr(t5x_bench, "_t5x_params", lambda module, model, p, s: model.params)

  def beam_fn(t5x, module, batch, steps, num_beams, alpha):
    return lambda params, enc: sd.decode(model, sd.Beam(num_beams=num_beams, alpha=alpha), enc,
                                         max_new_tokens=steps, eos_id=-1).beams
  monkeypatch.setattr(t5x_bench, "t5x_beam_fn", beam_fn)
  timing = t5x_bench.T5XTiming(batch_sizes=(2,), prompt_len=5, steps=6, repeats=1,
                               progress=False)
  results = t5x_bench.run_t5x_compare(model, None, timing, beam=(2, 0.6), drafter=model,
                                      gamma=2)
  row = results["rows"][0]
  assert row["identical_tokens"] and row["steps_per_target_call"] > 1.0
  assert results["beam"]["speculative"]["gamma"] == 2
  assert "exact speculative beam search" in t5x_bench.markdown(results)
  with pytest.raises(t5x_bench.CompareError, match="beam search only"):
    t5x_bench.run_t5x_compare(model, None, timing, drafter=model)
