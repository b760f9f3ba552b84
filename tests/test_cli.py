"""The `specdec` command line: decode (ids, text, JSON, stdin/file), errors, convert."""

import io
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from loopback import device_env

import specdec_jax as sd
from specdec_jax import cli
from specdec_jax import loading as models
from specdec_jax.costs import verify_cost_text
from specdec_jax.flags import FlagError
from specdec_jax.flags import common as options
from specdec_jax.io import prompts
from specdec_jax.io.reports import to_jsonable
from specdec_jax.io.tokenizer import train_sentencepiece

TARGET = "config:t5_1_1_tiny"
DRAFTER = "config:t5_1_1_tiny_drafter"
PROMPTS = ["5 17 42 1", "7 8 9 11 1"]
# One decode shape for most tests: jit caches are shared across them.
COMMON = ["--max-new-tokens", "6"]


def run(capsys, *argv):
  code = cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return code, out, err


def decode_json(capsys, *argv):
  code, out, err = run(capsys, "decode", "--model", TARGET, *COMMON, "--json", *argv)
  assert code == 0, err
  return json.loads(out), err


def parse_ids(out):
  return [[int(t) for t in line.split()] for line in out.splitlines()]


@pytest.mark.slow
def test_decode_token_ids_prints_one_line_of_ids_per_prompt(capsys):
  code, out, err = run(capsys, "decode", "--model", TARGET, *COMMON, *PROMPTS)
  assert code == 0, err
  rows = parse_ids(out)
  assert len(rows) == 2
  for row in rows:
    assert 1 <= len(row) <= 6 and all(0 <= t < 512 for t in row)
  assert "RANDOM weights" in err and "Traceback" not in err


def assert_same_stats(json_stats, stats):
  """The JSON statistics are exactly `stats` (a DecodeOutput.stats or merged mapping)."""
  expected = to_jsonable(dict(stats))
  assert set(json_stats) == set(expected)
  for key, value in expected.items():
    if isinstance(value, (bool, str)) or value is None:
      assert json_stats[key] == value, key
    else:
      np.testing.assert_allclose(json_stats[key], value, rtol=1e-6, err_msg=key)


def test_json_and_stats(capsys):
  payload, err = decode_json(capsys, "--stats", *PROMPTS)
  assert set(payload) >= {"outputs", "stats", "timing"}
  assert len(payload["outputs"]) == 2 and all(isinstance(t, int) for t in payload["outputs"][0])
  assert payload["lengths"] == [len(o) for o in payload["outputs"]]
  # the statistics are the library's for the same input, in the per-row meaning
  direct = sd.generate(models.load_model(TARGET), prompts.parse_token_ids(PROMPTS, 512),
                       max_new_tokens=6, rng=jax.random.PRNGKey(0))
  assert payload["outputs"] == [np.asarray(t)[:n].tolist()
                                for t, n in zip(direct.tokens, direct.lengths, strict=True)]
  stats = payload["stats"]
  assert_same_stats(stats, direct.stats)
  assert stats["target_calls"] == stats["tokens"] == sum(payload["lengths"])
  assert stats["tokens_per_target_call"] == 1.0 and stats["rounds"] == max(payload["lengths"])
  timing = payload["timing"]
  assert timing["generated_tokens"] == sum(payload["lengths"])
  assert timing["tokens_per_s"] > 0 and timing["ms_per_token"] > 0
  assert "tokens/s" in err and "ms/token" in err and "target calls" in err


@pytest.mark.slow
def test_greedy_speculative_equals_baseline(capsys):
  base, _ = decode_json(capsys, *PROMPTS)
  spec, err = decode_json(capsys, "--drafter", DRAFTER, "--gamma", "2", "--stats", *PROMPTS)
  assert spec["outputs"] == base["outputs"]
  stats = spec["stats"]
  direct = sd.speculative_generate(models.load_model(TARGET),
                                   models.load_model(DRAFTER, what="drafter"),
                                   prompts.parse_token_ids(PROMPTS, 512), gamma=2,
                                   max_new_tokens=6, rng=jax.random.PRNGKey(0))
  assert_same_stats(stats, direct.stats)
  assert 0.0 <= stats["alpha"] <= 1.0 and stats["gamma"] == 2
  assert 0.0 <= stats["acceptance_rate"] <= 1.0
  assert stats["acceptance_rate"] == pytest.approx(stats["accepted"] / stats["drafted"])
  assert stats["tokens_per_target_call"] == pytest.approx(stats["tokens"]
                                                          / stats["target_calls"])
  assert "acceptance rate" in err and "alpha" in err and "tokens/target call" in err


@pytest.mark.slow
def test_compare_times_the_baseline_on_the_same_inputs(capsys):
  out, err = decode_json(capsys, "--drafter", DRAFTER, "--gamma", "2", "--compare", *PROMPTS)
  compare = out["timing"]["compare"]
  assert compare["same_tokens"] is True          # greedy speculative == the target alone
  assert compare["ms_per_token"] > 0 and compare["baseline_ms_per_token"] > 0
  assert compare["speedup"] == pytest.approx(compare["baseline_ms_per_token"]
                                             / compare["ms_per_token"])
  # one labelled figure per quantity, each printed once, the same as in the JSON
  assert (f"target alone {compare['baseline_ms_per_token']:.2f} ms/token, speculative "
          f"{compare['ms_per_token']:.2f} ms/token, speedup {compare['speedup']:.2f}x") in err
  assert err.count(" ms/token") == 3    # the two above and exact mode's; no one-run figure
  # The figure explained by the run's own counts and its measured step costs.
  costs, stats = compare["costs"], out["stats"]
  assert costs["c"] > 0 and costs["verify_cost"] > 0 and costs["call_tokens"] == 3
  assert costs["tokens_per_target_call"] == pytest.approx(stats["tokens_per_target_call"])
  assert costs["drafts_per_target_call"] == pytest.approx(stats["drafter_calls"]
                                                          / stats["target_calls"])
  assert costs["round_cost"] == pytest.approx(
      costs["drafts_per_target_call"] * costs["c"] + max(costs["verify_cost"], 1.0))
  assert costs["expected_speedup"] == pytest.approx(costs["tokens_per_target_call"]
                                                    / costs["round_cost"])
  why = next(line for line in err.splitlines() if line.startswith("why"))
  assert f"{costs['tokens_per_target_call']:.2f} tokens per target call" in why
  assert f"verify cost {verify_cost_text(costs['verify_cost'])}" in why
  assert "expected" not in err and f"{costs['expected_speedup']:.2f}x" not in why
  assert ("timing noise" in err) == (costs["verify_cost"] < 1.0)
  base, err = decode_json(capsys, "--compare", *PROMPTS)   # nothing to compare the baseline with
  assert "compare" not in base["timing"] and "speedup" not in err


@pytest.mark.slow
def test_compare_divides_by_the_plain_baseline_and_reports_exact_cost(capsys, monkeypatch):
  """The speedup's baseline is the target alone at its natural width (exact=False); exact
  mode's own cost is a separate figure (the exact baseline over the plain one)."""
  from specdec_jax.runtime import jobs
  seen = []
  def spy(method, *args, **kwargs):
    seen.append((method.kind, method.exact))
    return real(method, *args, **kwargs)
  real = jobs.decode_corpus
  monkeypatch.setattr(jobs, "decode_corpus", spy)
  out, err = decode_json(capsys, "--drafter", DRAFTER, "--gamma", "2", "--compare", *PROMPTS)
  assert ("autoregressive", False) in seen and ("autoregressive", True) in seen
  assert ("autoregressive", None) not in seen
  compare = out["timing"]["compare"]
  assert compare["exact_cost"] == pytest.approx(compare["exact_baseline_ms_per_token"]
                                                / compare["baseline_ms_per_token"])
  assert "exact mode's cost" in err


def test_timings_exclude_compilation_by_default(capsys):
  out, err = decode_json(capsys, "--stats", *PROMPTS)
  assert out["timing"]["warmup"] is True and out["timing"]["includes_compile"] is False
  assert "compilation excluded" in err
  out, err = decode_json(capsys, "--stats", "--no-warmup", *PROMPTS)
  assert out["timing"]["includes_compile"] is True and "INCLUDES compilation" in err


@pytest.mark.slow
def test_bild_and_blockwise_methods_are_the_library_calls(capsys, tmp_path):
  enc = prompts.parse_token_ids(PROMPTS, 512)
  target = models.load_model(TARGET)
  small = models.load_model(DRAFTER, what="drafter")
  out, err = decode_json(capsys, "--method", "bild", "--drafter", DRAFTER, "--stats",
                         "--fallback-threshold", "0.3", "--rollback-threshold", "2", *PROMPTS)
  direct = sd.bild_generate(target, small, enc, fallback_threshold=0.3, rollback_threshold=2.0,
                            max_new_tokens=6, rng=jax.random.PRNGKey(0))
  assert out["outputs"] == [row[:n].tolist() for row, n in zip(np.asarray(direct.tokens),
                                                                np.asarray(direct.lengths),
                                                                strict=True)]
  assert_same_stats(out["stats"], direct.stats)
  assert out["settings"]["method"] == "bild" and out["settings"]["fallback_threshold"] == 0.3
  assert "fallback_rate" in err and "LOSSY" in err
  heads = sd.save_heads(tmp_path / "heads.safetensors", sd.init_heads(target, 3, rng=1))
  base, _ = decode_json(capsys, *PROMPTS)
  out, err = decode_json(capsys, "--method", "blockwise", "--heads", heads, "--lattice-k", "2",
                         "--num-drafts", "2", "--stats", *PROMPTS)
  assert out["outputs"] == base["outputs"]      # greedy blockwise is the target's greedy
  assert out["settings"]["num_drafts"] == 2 and "repeated_draft_rate" in err


@pytest.mark.slow
def test_speculative_flags_reach_the_method(capsys):
  """--adaptive-gamma / --lenience / --gamma (derived from sd.Speculative's fields) build
  the same method as the library call; --sampling sample is the sampling mode."""
  enc = prompts.parse_token_ids(PROMPTS, 512)
  out, _ = decode_json(capsys, "--drafter", DRAFTER, "--gamma", "3", "--adaptive-gamma",
                       "--lenience", "0.5", "--sampling", "sample", "--temperature", "0.7",
                       *PROMPTS)
  assert out["settings"]["method"] == "speculative"
  assert (out["settings"]["gamma"], out["settings"]["adaptive"],
          out["settings"]["lenience"]) == (3, True, 0.5)
  direct = sd.decode(models.load_model(TARGET),
                     sd.Speculative(models.load_model(DRAFTER, what="drafter"), gamma=3,
                                    adaptive=True, lenience=0.5),
                     enc, max_new_tokens=6, sampling=sd.Sampling(temperature=0.7),
                     rng=jax.random.PRNGKey(0))
  assert out["outputs"] == [row[:n].tolist() for row, n in zip(np.asarray(direct.tokens),
                                                                np.asarray(direct.lengths),
                                                                strict=True)]
  explicit, _ = decode_json(capsys, "--method", "speculative", "--drafter", DRAFTER, "--gamma",
                            "3", "--adaptive-gamma", "--lenience", "0.5", "--sampling",
                            "sample", "--temperature", "0.7", *PROMPTS)
  assert explicit["outputs"] == out["outputs"]


def test_speculative_flags_are_derived_from_the_fields():
  """Every setting of sd.Speculative is a flag of decode and eval (a field added to the
  class is a flag with no other change); each needs --drafter."""
  import argparse

  from flax import struct

  from specdec_jax import methods as core
  from specdec_jax.flags import methods as method_args

  @struct.dataclass
  class Eager(core.Speculative):
    """Speculative decoding that drafts early.

    Attributes:
      head_start: tokens drafted before the first verification.
      warm: draft from the previous round's cache.
    """

    head_start: int = core.setting(2)
    warm: bool | None = core.setting(None)

  parser = argparse.ArgumentParser()
  method_args.add_setting_flags(parser, Eager)
  args = parser.parse_args(["--head-start", "4", "--warm", "--adaptive-gamma", "--gamma", "2"])
  assert method_args.settings_from_args(args, Eager) == {
      "head_start": 4, "warm": True, "adaptive": True, "gamma": 2}
  assert "tokens drafted before the first verification (default 2)" in " ".join(
      parser.format_help().split())

  flags = {flag for flag, _ in method_args.setting_flags(core.Speculative)}
  assert flags == {"--gamma", "--adaptive-gamma", "--lenience"}
  for command in ("decode",):      # and the lab's `eval` (its tests/test_lab_commands.py)
    sub = cli.build_parser()._subparsers._group_actions[0].choices[command]
    text = " ".join(sub.format_help().split())
    assert all(flag in text for flag in flags), command
    assert "the small model hands over when" in text   # help from the class's Attributes
    assert "tokens drafted per round" in text          # or written for the command line
    # no Python in the help: code references, Python values, a default of None
    options = text.split("options:", 1)[1]
    assert not any(python in options for python in ("`", "True or", "default None")), options


@pytest.mark.parametrize("flag", ["--gamma", "--adaptive-gamma", "--lenience"])
def test_drafter_only_flags_need_a_drafter(capsys, flag):
  from specdec_jax import methods as core
  from specdec_jax.flags import methods as method_args
  field = dict(method_args.setting_flags(core.Speculative))[flag]
  value = [] if isinstance(field.default, bool) or field.default is None else [
      str(field.default)]
  code, out, err = run(capsys, "decode", "--model", TARGET, flag, *value, PROMPTS[0])
  assert code == 1 and out == ""
  owners = "speculative / speculative-beam" if flag == "--gamma" else "speculative"
  assert (f"specdec decode: error: {flag} only applies to --method {owners}, not --method "
          "autoregressive: add --drafter") in err


@pytest.mark.slow
def test_batches_merge_into_one_run(capsys):
  """--batch-size 1 decodes two calls; their statistics merge to the one-call statistics."""
  one, _ = decode_json(capsys, "--drafter", DRAFTER, "--gamma", "2", *PROMPTS)
  two, _ = decode_json(capsys, "--drafter", DRAFTER, "--gamma", "2", "--batch-size", "1",
                       *PROMPTS)
  assert two["outputs"] == one["outputs"] and two["timing"]["batch_size"] == 1
  for key in ("target_calls", "drafted", "accepted", "tokens", "beta_count", "alpha",
              "acceptance_rate", "tokens_per_target_call", "per_position_accepted"):
    np.testing.assert_allclose(two["stats"][key], one["stats"][key], rtol=1e-6, err_msg=key)


def test_main_reports_any_specdec_error_in_one_line(capsys, monkeypatch):
  """main catches SpecdecError (any subclass, core or tools): one line, exit code 1;
  anything else is a bug and propagates."""
  from specdec_jax.cli import decode

  def fail(error):
    def run(args):
      raise error
    return run
  for error in (sd.SpecdecError("plain base class"), sd.InputError("core input error"),
                FlagError("tool data error\nsecond line")):
    monkeypatch.setattr(decode, "run", fail(error))
    code, out, err = run(capsys, "decode", "--model", TARGET, "5 1")
    assert code == 1 and out == ""
    assert err == f"specdec decode: error: {str(error).splitlines()[0]}\n"
  monkeypatch.setattr(decode, "run", fail(RuntimeError("a bug")))
  with pytest.raises(RuntimeError, match="a bug"):
    cli.main(["decode", "--model", TARGET, "5 1"])


# A command whose logs come three ways (Python's stdout, a C library's writes to descriptor
# 1, as Gloo's connection lines do, and stderr) beside its results; then a write at exit.
_NOISY = """
import os, sys
from specdec_jax import cli
from specdec_jax.cli import decode
from specdec_jax.io import streams

def noisy(args):
  print("python log")
  os.write(1, b"[Gloo] Rank 0 is connected to 1 peer ranks\\n")
  print("stderr log", file=sys.stderr)
  streams.emit("result 1")
  streams.emit("result 2")
  return 0

decode.run = noisy
sys.argv = ["specdec", "decode", "--model", "m", "5 1"]
code = cli.main()
os.write(1, b"[Gloo] at exit\\n")
sys.exit(code)
"""


@pytest.mark.slow
def test_stdout_carries_only_the_results():
  """In a process of its own (stdout a pipe: descriptor 1 itself), every log lands on
  stderr, also one a C library writes to descriptor 1, before or after the results."""
  run_ = subprocess.run([sys.executable, "-c", _NOISY], capture_output=True, text=True,
                        timeout=300, env=device_env(1))
  assert run_.returncode == 0, run_.stderr
  assert run_.stdout == "result 1\nresult 2\n"
  for log in ("python log", "[Gloo] Rank 0 is connected", "stderr log", "[Gloo] at exit"):
    assert log in run_.stderr, run_.stderr


def test_stdout_is_restored_after_a_command(capfd):
  """`main` called in a process (tests, scripts) gives descriptor 1 and sys.stdout back."""
  from specdec_jax.io import streams
  with streams.results_stdout():
    os.write(1, b"log\n")
    streams.emit("result")
  os.write(1, b"after\n")
  out, err = capfd.readouterr()
  assert out == "result\nafter\n" and err == "log\n"


def test_decode_runs_on_typed_settings_without_argparse(capsys):
  """The namespace stops at the CLI's edge: `decode.from_args` gives the core method value
  (settings checked, models None) and a frozen DecodeRun, and `decode.decode` on typed
  settings built by hand prints what the command line does."""
  import dataclasses

  from specdec_jax.cli import decode
  from specdec_jax.flags import methods as method_args
  argv = ["decode", "--model", TARGET, *COMMON, "--drafter", DRAFTER, "--gamma", "2",
          "--seed", "3", *PROMPTS]
  args = cli.build_parser().parse_args(argv)
  choice, settings = decode.from_args(args)
  assert choice.value == sd.Speculative(None, gamma=2) and choice.value.drafter is None
  assert choice.name == "speculative" and choice.drafter == DRAFTER and choice.sampling.is_greedy
  assert settings == decode.DecodeRun(model=TARGET, prompts=tuple(PROMPTS), max_new_tokens=6,
                                      seed=3)
  with pytest.raises(dataclasses.FrozenInstanceError):
    settings.seed = 4
  with pytest.raises(sd.SpecdecError, match="--max-new-tokens must be an integer >= 1"):
    decode.DecodeRun(model=TARGET, max_new_tokens=0)
  code, expected, err = run(capsys, *argv)
  assert code == 0, err
  by_hand = method_args.MethodChoice(value=sd.Speculative(None, gamma=2), sampling=sd.Greedy(),
                                     drafter=DRAFTER)
  assert decode.decode(by_hand, settings) == 0
  assert capsys.readouterr().out == expected


def test_demo_models_say_what_they_are(capsys):
  """Beside a demo model's outputs, one line on stderr says it is a laptop-scale demo (and
  README says so by the main command); other models get none."""
  from specdec_jax import package_data
  from specdec_jax.cli.decode_report import DEMOS, demo_note
  assets = package_data.package_root().joinpath("assets")
  bundled = {p.name for p in assets.iterdir() if p.is_dir()} if assets.is_dir() else set()
  assert bundled | set(package_data.SEPARATE) <= set(DEMOS)      # every bundled group
  note = demo_note("demo-de-en-large/target", "demo-de-en-large/drafter")
  assert note.startswith("demo-de-en-large is a De→En demo pair")
  assert "laptop-scale dictionary corpus" in note and "BLEU 10.4" in note
  assert note.endswith("not translation quality")
  assert demo_note(TARGET, "demo-en-lm/drafter").startswith("demo-en-lm is")
  assert demo_note(TARGET, DRAFTER, None) is None
  readme = " ".join((pathlib.Path(__file__).parents[1] / "README.md").read_text().split())
  assert "laptop-scale dictionary corpus" in readme and "not translation" in readme
  code, out, err = run(capsys, "decode", "--model", TARGET, *COMMON, PROMPTS[0])
  assert code == 0 and "demo" not in out + err, err


@pytest.mark.slow
def test_table_drafters(capsys):
  # Decoding with table drafters is the library's business (tests/test_generate.py); here
  # only what the CLI builds: n-gram tables fitted on the prompts, prompt lookup.
  target = models.load_model(TARGET)
  tokens = prompts.parse_token_ids(PROMPTS, 512)
  ngram = models.resolve_drafter("ngram", target, ngram_rows=tokens)
  assert isinstance(ngram, sd.NGramDrafter) and ngram.vocab_size == 512
  assert int(np.argmax(ngram.logits_after(np.asarray([17]))[0])) == 42   # 17 -> 42 in prompt 1
  lookup = models.resolve_drafter("prompt-lookup", target)
  assert isinstance(lookup, sd.PromptLookupDrafter) and lookup.vocab_size == 512


def test_prompts_from_input_file_and_stdin(capsys, tmp_path, monkeypatch):
  code, expected, err = run(capsys, "decode", "--model", TARGET, *COMMON, *PROMPTS)
  assert code == 0, err
  path = tmp_path / "prompts.txt"
  path.write_text(f"{PROMPTS[0]}\n{PROMPTS[1]}\n")   # blank lines: test_input_rows.py
  code, out, err = run(capsys, "decode", "--model", TARGET, *COMMON, "--input-file", path)
  assert code == 0, err
  assert out == expected
  monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(PROMPTS) + "\n"))
  code, out, err = run(capsys, "decode", "--model", TARGET, *COMMON)
  assert code == 0, err
  assert out == expected
  monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(PROMPTS)))
  code, out, err = run(capsys, "decode", "--model", TARGET, *COMMON, "-")
  assert code == 0 and out == expected, err


def with_vocab(model, vocab_size):
  """`model` cut to its first `vocab_size` tokens: a random model of that vocabulary, made
  without compiling an initialiser (sd.init_model(config.replace(vocab_size=...)) is the
  same thing, slower)."""
  params = jax.tree_util.tree_map(np.asarray, model.params)
  params["token_embedder"]["embedding"] = params["token_embedder"]["embedding"][:vocab_size]
  kernel = params["decoder"]["logits_dense"]["kernel"]
  params["decoder"]["logits_dense"]["kernel"] = kernel[:, :vocab_size]
  return sd.Model(config=model.config.replace(vocab_size=vocab_size), params=params)


@pytest.fixture(scope="module")
def other_vocab_drafter(tmp_path_factory):
  """A saved drafter whose vocabulary (300) differs from the tiny target's (512)."""
  path = tmp_path_factory.mktemp("drafter300")
  sd.save(path, with_vocab(models.load_model(DRAFTER, what="drafter"), 300))
  return path


@pytest.mark.parametrize("argv, problem", [
    (["--model", "config:no_such_config"], "unknown config"),
    (["--model", "/no/such/checkpoint_dir"], "no such file or directory"),
    (["--gamma", "0", "--drafter", DRAFTER], "--gamma must be an integer >= 1"),
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "1.5"], "top_p"),
    (["--top-p", "0"], "top_p"),
    (["--sampling", "greedy", "--temperature", "0.5"], "only apply with --sampling sample"),
    (["--gamma", "3"], "add --drafter"),
    (["--lenience", "0", "--drafter", DRAFTER], "lenience"),
    (["--max-new-tokens", "0"], "max-new-tokens"),
    (["--drafter", "OTHER"], "vocabulary mismatch"),
    (["--tokenizer", "/no/such/spiece.model"], "tokenizer"),
    (["--input-file", "/no/such/prompts.txt"], "No such file"),
])
def test_bad_input_exits_1_with_one_line(capsys, argv, problem, other_vocab_drafter):
  argv = [str(other_vocab_drafter) if a == "OTHER" else a for a in argv]
  if "--model" not in argv:
    argv = ["--model", TARGET, *argv]
  if "--input-file" not in argv:
    argv = [*argv, PROMPTS[0]]
  code, out, err = run(capsys, "decode", *COMMON, *argv)
  assert code == 1
  assert out == ""
  errors = [line for line in err.splitlines() if "error" in line]
  assert len(errors) == 1 and errors[0].startswith("specdec decode: error: "), err
  assert problem.lower() in errors[0].lower(), err
  assert "Traceback" not in err


@pytest.mark.parametrize("prompt, problem", [
    ("5 x 1", "'x' is not an integer token id"),
    ("5 1.5", "not an integer"),
    ("5 512", "outside the model vocabulary"),
    ("-3 1", "outside the model vocabulary"),
])
def test_bad_prompt_ids_exit_1(capsys, prompt, problem):
  code, out, err = run(capsys, "decode", "--model", TARGET, *COMMON, prompt)
  assert code == 1 and problem in err and "Traceback" not in err


def test_argparse_errors_exit_2(capsys):
  assert run(capsys, "decode", "5 1")[0] == 2             # --model missing
  assert run(capsys, "decode", "--model", TARGET, "--method", "sample", "5")[0] == 2
  code, out, err = run(capsys, "decode", "--model", TARGET, "--method", "sample", "5 1")
  assert code == 2 and out == ""
  assert "'sample' is a sampling mode: use --sampling sample" in err
  assert run(capsys)[0] == 2                               # no subcommand
  assert run(capsys, "--help")[0] == 0


def test_version(capsys):
  from importlib.metadata import version
  code, out, _ = run(capsys, "--version")
  assert code == 0 and out == f"specdec {version('specdec-jax')}\n"


def test_interrupt_exits_130(capsys, monkeypatch):
  from specdec_jax.cli import decode

  def interrupted(args):
    raise KeyboardInterrupt
  monkeypatch.setattr(decode, "run", interrupted)
  code, out, err = run(capsys, "decode", "--model", TARGET, "5 1")
  assert code == 130 and out == "" and err == "specdec decode: interrupted\n"


@pytest.mark.slow
def test_text_prompts_with_a_tokenizer(capsys, tmp_path):
  corpus = [f"{s} {v} {o}." for s in ("Der Hund", "Die Katze", "Ein Junge", "Das Haus")
            for v in ("sieht", "mag", "sucht") for o in ("den Baum", "die Brücke", "das Öl")]
  tok = train_sentencepiece(corpus, tmp_path / "tok" / "spiece", vocab_size=32)
  model = with_vocab(models.load_model(TARGET), tok.vocab_size)
  sd.save(tmp_path / "model", model)
  capsys.readouterr()
  texts = ["Der Hund sieht den Baum.", "Die Katze mag das Öl."]
  args = ["decode", "--model", tmp_path / "model", "--tokenizer", tmp_path / "tok" / "spiece.model",
          *COMMON]
  code, out, err = run(capsys, *args, *texts)
  assert code == 0, err
  lines = out.splitlines()
  assert len(lines) == 2 and "RANDOM" not in err
  code, out, err = run(capsys, *args, "--json", *texts)
  payload = json.loads(out)
  assert all(isinstance(o, str) for o in payload["outputs"])
  # Text output is the tokenizer's decoding of exactly the ids the library generates.
  direct = sd.generate(model, tok.encode(texts), max_new_tokens=6)
  assert payload["outputs"] == tok.decode(np.asarray(direct.tokens))
  # A tokenizer larger than the model's vocabulary is refused.
  sd.save(tmp_path / "small", with_vocab(models.load_model(TARGET), 20))
  code, _, err = run(capsys, "decode", "--model", tmp_path / "small", "--tokenizer",
                     tmp_path / "tok" / "spiece.model", "hallo")
  assert code == 1 and "pieces" in err


def _flat(params):
  return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
          for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}


@pytest.mark.slow
def test_convert_round_trip(capsys, tmp_path):
  original = _flat(models.load_model(TARGET).params)
  code, _, err = run(capsys, "convert", TARGET, tmp_path / "ours")
  assert code == 0, err
  loaded = _flat(sd.load(str(tmp_path / "ours")).params)
  assert loaded.keys() == original.keys()
  for key, value in original.items():
    np.testing.assert_array_equal(loaded[key], value, err_msg=key)
  # Our format -> HF -> back again, and a bfloat16 copy.
  code, _, err = run(capsys, "convert", tmp_path / "ours", tmp_path / "hf", "--to", "hf")
  assert code == 0, err
  assert (tmp_path / "hf" / "config.json").exists()
  from_hf = _flat(sd.load(str(tmp_path / "hf")).params)
  for key, value in original.items():
    np.testing.assert_array_equal(from_hf[key], value, err_msg=key)
  code, _, err = run(capsys, "convert", tmp_path / "ours", tmp_path / "bf16", "--dtype", "bfloat16")
  assert code == 0, err
  stored = _flat(sd.load(str(tmp_path / "bf16"), dtype=None).params)
  assert all(str(v.dtype) == "bfloat16" for v in stored.values())
  # A non-empty destination is refused unless --force.
  code, _, err = run(capsys, "convert", TARGET, tmp_path / "ours")
  assert code == 1 and "--force" in err
  assert run(capsys, "convert", TARGET, tmp_path / "ours", "--force")[0] == 0


def test_console_script_smoke():
  exe = shutil.which("specdec") or os.path.join(os.path.dirname(sys.executable), "specdec")
  if not os.path.exists(exe):
    pytest.skip("console script not installed")
  result = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0
  for command in ("decode", "convert", "plan"):
    assert command in result.stdout


def test_int_list_parses_lists_and_ranges():
  import argparse
  assert options.int_list("1,2,4") == [1, 2, 4]
  assert options.int_list("1-3,8") == [1, 2, 3, 8]
  for bad in ("", "0,1", "a", "2-x", "-1"):
    with pytest.raises(argparse.ArgumentTypeError):
      options.int_list(bad)
