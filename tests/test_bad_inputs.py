"""The 19 bad inputs of issue 31 that were silent or ended in a raw exception: each now
gets a `SpecdecError` naming the problem (the CLI: one line, non-zero exit) or is handled
as documented. Cheap: tiny random models, the small bundled pairs, errors before tracing.

Silent before: a prompt past a rotary LM's positions (CLI and `sd.decode`), prompt + new
tokens past them, another model's tokenizer on a T5 model (decode and eval), `convert
--force` over another checkpoint (a mixed folder; `sd.load` read the old model), `sd.save`
keeping another model's tokenizer, an unknown `eval --split`, a T5 prompt without EOS.
Raw before: a non-UTF-8 .jsonl, a tokenizer or a string as `sd.decode`'s target, a string
as `sd.shard`'s mesh, a lone surrogate in a text to encode, "pass --force" said to a
`--force` call, a bad `bench --out` found after the work, the offline Hub's traceback.
The cases of the lab's commands (eval, bench, sweep-bild) are the lab's tests
(packages/specdec-jax-lab/tests/test_lab_bad_inputs.py).
"""

import json
import shutil
import traceback

import jax
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import cli, package_data
from specdec_jax.io.tokenizer import TOKENIZER_FILES, check_tokenizer
from specdec_jax.rounds import engine

LONG_TEXT = " ".join(["the cat sat on the mat"] * 27)    # 160 tokens and BOS


def run(capsys, *argv):
  code = cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return code, out, err


def failed(capsys, *argv) -> str:
  """The one error line of a failing command (no traceback, nothing on stdout)."""
  code, out, err = run(capsys, *argv)
  lines = err.strip().splitlines()
  assert code != 0 and out == "", (code, out, err)
  assert "Traceback" not in err and lines[-1].startswith("specdec "), err
  return lines[-1]


@pytest.fixture
def no_trace(monkeypatch):
  """Fail the test if a decode reaches the jitted engine: the error must come first."""
  def reached(*args, **kwargs):
    raise AssertionError("the request reached engine.run: checked too late")
  monkeypatch.setattr(engine, "run", reached)


@pytest.fixture(scope="module")
def t5():
  return sd.load("config:t5_1_1_tiny")


@pytest.fixture(scope="module")
def lm_tok():
  pytest.importorskip("tokenizers")
  return sd.load_tokenizer("demo-en-lm")


# ----------------------------------------------------------------------------- lengths


@pytest.mark.slow
@pytest.mark.parametrize("family, scheme", [("llama_tiny", "rotary"), ("gpt2_tiny", "learned")])
def test_prompt_and_new_tokens_past_the_positions_at_decode(no_trace, family, scheme):
  """Every decoder-only position scheme: P + max_new_tokens past max_positions is refused
  (rotary LMs were not checked at all); exactly max_positions passes the check."""
  model = sd.init_model(sd.get_config(family, max_positions=16), 0)
  prompt = np.full((2, 10), 5, np.int32)
  with pytest.raises(sd.InputError, match=rf"prompt buffer of 10 tokens and max_new_tokens=7 "
                                          rf"exceed the model's 16 {scheme} positions"):
    sd.decode(model, sd.Autoregressive(), prompt, max_new_tokens=7)
  with pytest.raises(AssertionError, match="reached engine.run"):    # 10 + 6 fits
    sd.decode(model, sd.Autoregressive(), prompt, max_new_tokens=6)


def test_relative_positions_are_capped_by_max_encoder_length(t5, no_trace):
  """T5's relative buckets have no trained limit: `max_encoder_length` caps the input."""
  capped = t5.replace(config=t5.config.replace(max_encoder_length=8))
  enc = np.array([[5] * 8 + [1]], np.int32)
  with pytest.raises(sd.InputError, match=r"length 9, longer than the model allows "
                                          r"\(max_encoder_length=8\)"):
    sd.decode(capped, sd.Autoregressive(), enc, max_new_tokens=4)
  with pytest.raises(AssertionError, match="reached engine.run"):
    sd.decode(capped, sd.Autoregressive(), enc[:, 1:], max_new_tokens=4)


@pytest.mark.slow
def test_cli_prompt_past_the_bundled_lm_positions_is_an_error(capsys, lm_tok):
  """161 tokens on the bundled LM (64 positions): was an empty output and exit 0."""
  n = len(lm_tok.encode_one(LONG_TEXT))
  assert n > 64
  line = failed(capsys, "decode", "--model", "demo-en-lm/target", "--tokenizer", "demo-en-lm",
                "--max-new-tokens", "8", "a short one", LONG_TEXT)
  assert f"prompt 2 holds {n} tokens, but the model has 64 positions" in line


@pytest.mark.slow
def test_cli_budget_is_fitted_to_the_lm_positions(capsys, lm_tok):
  """Prompt + --max-new-tokens past the positions: the budget is lowered, with a note, and
  the output is `sd.decode`'s with that budget."""
  text = " ".join(["the cat sat on the mat"] * 9)
  prompt, lengths = lm_tok.encode_prompts([text])
  budget = 64 - int(lengths[0])
  code, out, err = run(capsys, "decode", "--model", "demo-en-lm/target", "--tokenizer",
                       "demo-en-lm", "--max-new-tokens", "40", "--no-warmup", "--json", text)
  assert code == 0, err
  assert f"--max-new-tokens 40 lowered to {budget}" in err
  res = json.loads(out)
  target = sd.load("demo-en-lm/target")
  want = sd.decode(target, sd.Autoregressive(), prompt, max_new_tokens=budget,
                   prompt_lengths=lengths)
  assert res["settings"]["max_new_tokens"] == budget
  assert res["outputs"] == lm_tok.decode_continuations(np.asarray(want.tokens))
  assert res["lengths"] == np.asarray(want.lengths).tolist()


# ----------------------------------------------------------------------------- tokenizers


def test_lm_tokenizer_on_the_t5_pair_is_refused(capsys, lm_tok):
  """The LM's tokenizer on the De->En T5 model: was garbage output (decode), exit 0 (and
  BLEU 1.68 in `eval`: the lab's tests/test_lab_bad_inputs.py). Sizes differ (4096 vs
  8000); with equal sizes, its special ids differ."""
  line = failed(capsys, "decode", "--model", "demo-de-en/target", "--tokenizer", "demo-en-lm",
                "Guten Morgen.")
  assert "has 4096 ids but the model's vocabulary is 8000" in line
  same_size = sd.get_config("t5_1_1_tiny", vocab_size=lm_tok.vocab_size)
  with pytest.raises(sd.TokenizerError, match="eos_id 2, the T5 model 1"):
    check_tokenizer(lm_tok, same_size)
  check_tokenizer(sd.load_tokenizer("demo-de-en"), sd.load("demo-de-en/target"))   # its own


def test_lone_surrogate_in_a_text_is_a_tokenizer_error(capsys, lm_tok):
  """Bytes that are not UTF-8 (Python's surrogateescape): was pybind11's RuntimeError."""
  for tok in (sd.load_tokenizer("demo-de-en"), lm_tok):
    with pytest.raises(sd.TokenizerError, match=r"'\\udcff' at position 1, a lone surrogate"):
      tok.encode(["a\udcffb"])
    assert tok.encode(["ab"]).shape[0] == 1
  with pytest.raises(sd.TokenizerError, match="lone surrogate"):
    lm_tok.encode_prompts(["ok", "\ud800"])
  line = failed(capsys, "decode", "--model", "demo-de-en/target", "--tokenizer", "demo-de-en",
                "a\udcffb")
  assert "lone surrogate" in line


# ----------------------------------------------------------------------------- files


@pytest.mark.slow
def test_convert_force_replaces_another_checkpoint(capsys, tmp_path):
  """`convert --force` into a folder holding another model: its checkpoint and tokenizer
  are removed first (was a mixed folder from which `sd.load` read the OLD model); other
  files are kept; a T5X checkpoint is refused."""
  dst = tmp_path / "dst"
  assert run(capsys, "convert", "demo-en-lm/drafter", dst)[0] == 0      # ours + tokenizer.json
  (dst / "notes.txt").write_text("mine")
  code, _, err = run(capsys, "convert", "config:t5_1_1_tiny", dst, "--to", "hf", "--force")
  assert code == 0, err
  assert "removed" in err and "specdec_config.json" in err
  names = {p.name for p in dst.iterdir()}
  assert not names & {"specdec_config.json", "params.safetensors", *TOKENIZER_FILES}
  assert "notes.txt" in names
  back = sd.load(str(dst))
  assert not back.is_decoder_only and back.config.vocab_size == 512
  # and back: ours over Hugging Face's files
  code, _, err = run(capsys, "convert", "demo-en-lm/drafter", dst, "--force")
  assert code == 0, err
  assert "config.json" not in {p.name for p in dst.iterdir()}
  assert sd.load(str(dst)).is_decoder_only
  t5x = tmp_path / "t5x"
  (t5x / "checkpoint_10").mkdir(parents=True)
  (t5x / "checkpoint_10" / "checkpoint").write_bytes(b"")
  line = failed(capsys, "convert", "demo-en-lm/drafter", t5x, "--force")
  assert "holds a T5X checkpoint" in line


def test_force_is_never_told_to_pass_force(capsys, tmp_path):
  (tmp_path / "file").write_text("x")
  line = failed(capsys, "convert", "demo-en-lm/drafter", tmp_path / "file", "--force")
  assert "is a file" in line and "pass --force" not in line
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "x").write_text("x")
  assert "pass --force" in failed(capsys, "convert", "demo-en-lm/drafter", tmp_path / "full")


def test_save_over_another_model_drops_its_tokenizer(t5, tmp_path):
  """`sd.save` over another model's checkpoint of ours: its tokenizer files go (they were
  kept, and `sd.load_tokenizer(dir)` paired them with the new model); a re-save of the same
  model in another dtype keeps them."""
  d = tmp_path / "m"
  sd.save(d, t5)
  shutil.copyfile(str(package_data.assets("demo-de-en") / "demo-de-en" / "spiece.model"),
                  d / "spiece.model")
  sd.save(d, t5, dtype="bfloat16")
  assert (d / "spiece.model").is_file()
  sd.save(d, sd.init_model(sd.get_config("llama_tiny"), 0))
  assert not (d / "spiece.model").exists()
  assert sd.load(str(d)).is_decoder_only


# ----------------------------------------------------------------------------- Python API


def test_decode_target_must_be_a_model(t5, no_trace):
  """A tokenizer or a name as the target: was AttributeError 'is_decoder_only'."""
  enc = np.array([[5, 6, 1]], np.int32)
  with pytest.raises(sd.InputError, match=r"got Tokenizer: pass the model as target"):
    sd.decode(sd.load_tokenizer("demo-de-en"), sd.Autoregressive(), enc, 4)
  with pytest.raises(sd.InputError, match=r"target is the str 'demo-de-en/target': load the "
                                          r"model first"):
    sd.generate("demo-de-en/target", enc, 4)
  with pytest.raises(sd.InputError, match=r"target must be an sd.Model"):
    sd.speculative_generate(None, t5, enc, gamma=2, max_new_tokens=4)


def test_shard_needs_a_mesh(t5):
  """A string as the mesh: was AttributeError 'axis_names'."""
  with pytest.raises(sd.InputError, match=r"takes a jax.sharding.Mesh .*got str 'data=2'.*"
                                          r"sd.make_mesh"):
    sd.shard(t5, "data=2")
  with pytest.raises(sd.InputError, match=r"replicate\(tree, mesh\) takes a jax.sharding.Mesh"):
    sd.sharding.replicate(t5, "model=1")
  with pytest.raises(sd.InputError, match=r"shard_batch\(x, mesh\) takes"):
    sd.sharding.shard_batch(np.zeros((2, 3), np.int32), None)
  assert sd.shard(t5, sd.make_mesh(devices=jax.devices()[:1])).config == t5.config


def test_offline_hub_load_is_one_line(monkeypatch, capsys):
  """A Hub id that cannot be fetched: one line naming the cause (was a 105-line chained
  traceback through the HTTP stack)."""
  hub = pytest.importorskip("huggingface_hub")

  def offline(*args, **kwargs):
    try:
      raise ConnectionError("[Errno -2] Name or service not known")
    except ConnectionError as e:
      raise OSError("Cannot find an appropriate cached snapshot folder.\nSecond line.") from e
  monkeypatch.setattr(hub, "snapshot_download", offline)
  with pytest.raises(sd.CheckpointError) as info:
    sd.load("someone/some-model")
  e = info.value
  assert e.__cause__ is None and e.__suppress_context__
  assert str(e).endswith("failed: OSError: Cannot find an appropriate cached snapshot folder.")
  assert len(traceback.format_exception_only(type(e), e)) == 1
  line = failed(capsys, "decode", "--model", "someone/some-model", "5 1")
  assert "Hugging Face Hub failed: OSError: Cannot find" in line


# ----------------------------------------------------------------------------- EOS


@pytest.mark.slow
def test_t5_prompt_without_eos_is_noted_and_decoded_verbatim(capsys, t5):
  """Token ids are used verbatim (documented: no EOS is added); a T5 prompt without a final
  EOS gets a note naming it, and decodes as `sd.decode` of the same ids."""
  code, out, err = run(capsys, "decode", "--model", "config:t5_1_1_tiny", "--no-warmup",
                       "--max-new-tokens", "4", "--json", "5 17 42", "5 6 1")
  assert code == 0, err
  assert "prompt 1 does not end in EOS (1)" in err and "prompt 2" not in err
  want = sd.decode(t5, sd.Autoregressive(), np.array([[5, 17, 42], [5, 6, 1]], np.int32), 4)
  rows = [list(r[:n]) for r, n in zip(np.asarray(want.tokens), np.asarray(want.lengths),
                                             strict=True)]
  assert json.loads(out)["outputs"] == [[int(t) for t in r] for r in rows]
  code, _, err = run(capsys, "decode", "--model", "config:t5_1_1_tiny", "--no-warmup",
                     "--max-new-tokens", "4", "5 6 1")
  assert code == 0 and "EOS" not in err


# ----------------------------------------------------------------------------- the sweep


def test_wrong_types_for_paths_configs_and_texts(t5, tmp_path):
  """Found by the lab's bad-input sweep (packages/specdec-jax-lab/scripts/bad_input_sweep.py):
  each was a TypeError or AttributeError."""
  with pytest.raises(sd.InputError, match="takes a path or a name"):
    sd.load(None)
  with pytest.raises(sd.InputError, match="config must be an sd.T5Config"):
    sd.load("config:t5_1_1_tiny", config={"emb_dim": 4})
  with pytest.raises(sd.ConfigError, match="init_model takes an sd.T5Config"):
    sd.init_model("t5_1_1_tiny", 0)
  with pytest.raises(sd.TokenizerError, match="takes a path or a bundled name"):
    sd.load_tokenizer(123)
  with pytest.raises(sd.TokenizerError, match="expects a list of strings, got NoneType"):
    sd.load_tokenizer("demo-de-en").encode(None)
  with pytest.raises(sd.SamplingError, match="sampling dict: .*'temp'.*temperature, top_k"):
    sd.generate(t5, np.array([[5, 1]], np.int32), 2, sampling={"temp": 1.0}, rng=0)
  (tmp_path / "file").write_text("x")
  with pytest.raises(sd.CheckpointError, match="cannot write a checkpoint to .*file/m"):
    sd.save(tmp_path / "file" / "m", t5)


def test_settings_out_of_range_found_by_the_sweep(t5, no_trace):
  with pytest.raises(sd.InputError, match=r"initial_alpha must be in \[0, 1\], got 1.5"):
    sd.AdaptiveGamma(initial_alpha=1.5)
  with pytest.raises(sd.InputError, match="top_k must be an integer >= 1, got 0"):
    sd.NGramDrafter.fit([[5, 6]], 512, top_k=0)
  with pytest.raises(sd.InputError, match="vocab_size must be an integer >= 1"):
    sd.NGramDrafter.fit([[5, 6]], 0)
  enc = np.array([[5, 17, 1], [7, 8, 1]], np.int32)
  with pytest.raises(sd.InputError, match=r"own input tokens have \(1,\) rows, the target's "
                                          r"\(2,\)"):
    sd.speculative_generate(t5, t5, enc, gamma=2, max_new_tokens=4,
                            drafter_inputs=enc[:1])


@pytest.mark.slow
def test_cli_flags_found_by_the_sweep(capsys):
  """Each exited 0 before: a 0 of another method's flag read as not given, beam with a
  drafter (ignored), --compile-workers 0."""
  dec = ["decode", "--model", "config:t5_1_1_tiny", "--max-new-tokens", "2", "--no-warmup"]
  line = failed(capsys, *dec, "--lattice-k", "0", "5 1")
  assert "--lattice-k only applies to --method blockwise" in line
  assert "--num-drafts only applies" in failed(capsys, *dec, "--num-drafts", "0", "5 1")
  # (beam with a drafter is exact speculative beam search since; the target alone is not)
  line = failed(capsys, *dec, "--method", "autoregressive", "--drafter",
                "config:t5_1_1_tiny_drafter", "5 1")
  assert "--method autoregressive (the target alone, one token per call (sd.generate)) " \
         "takes no --drafter: drop --drafter" in line
  line = failed(capsys, "bench", "--target", "config:t5_1_1_tiny", "--compile-workers", "0")
  assert "--compile-workers must be at least 1, got 0" in line
