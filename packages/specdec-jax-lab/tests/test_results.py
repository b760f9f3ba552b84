"""specdec_jax_lab.results: the demo-pair results pipeline on a tiny synthetic workdir, and
its tables showing a verify cost below 1.0 as timing noise (model-free)."""

import json
import pathlib

import jax
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import costs, theory
from specdec_jax.costs import verify_cost_text
from specdec_jax.io.tokenizer import train_sentencepiece
from specdec_jax_lab import results as R
from specdec_jax_lab.data import de_en, prepare
from specdec_jax_lab.results import headline
from specdec_jax_lab.results.report import markdown_table

WORDS_DE = "der die das haus hund katze baum wasser brot gut klein gross rot blau".split()
WORDS_EN = "the the the house dog cat tree water bread good small big red blue".split()


def _pairs(n, seed):
  rng = np.random.RandomState(seed)
  out = []
  for _ in range(n):
    idx = rng.randint(0, len(WORDS_DE), rng.randint(2, 5))
    out.append(de_en.Pair(de=" ".join(WORDS_DE[i] for i in idx),
                          en=" ".join(WORDS_EN[i] for i in idx)))
  return out


def _write_split(data_dir, name, tok, pairs, max_len=12):
  inputs, targets, kept = prepare.encode_split(tok, pairs, max_len)
  np.savez(data_dir / f"{name}.npz", inputs=inputs, targets=targets)
  (data_dir / f"{name}.jsonl").write_text(
      "".join(json.dumps({"de": p.de, "en": p.en}) + "\n" for p in kept))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  root = tmp_path_factory.mktemp("demo")
  data = root / "data"
  data.mkdir()
  train = _pairs(60, 0)
  tok = train_sentencepiece([t for p in train for t in (p.de, p.en)], data / "spiece",
                            vocab_size=48)
  _write_split(data, "train", tok, train)
  _write_split(data, "test", tok, _pairs(10, 1))
  vocab = tok.vocab_size
  target = sd.init_model(sd.get_config("t5_1_1_tiny").replace(vocab_size=vocab), 0)
  params = jax.tree_util.tree_map(lambda x: x, target.params)
  params["decoder"]["logits_dense"]["kernel"] = params["decoder"]["logits_dense"]["kernel"] * 6
  sd.save(root / "target" / "final", target.replace(params=params))
  drafter = sd.init_model(sd.get_config("t5_1_1_tiny_drafter").replace(vocab_size=vocab), 1)
  sd.save(root / "drafter" / "final", drafter)   # aligned / distilled absent: skipped
  return root


@pytest.mark.slow
def test_pipeline_writes_json_md_png_and_greedy_bleu_matches(workdir, tmp_path):
  out = tmp_path / "out"
  # One table drafter: both are `evaluation.resolve_drafter`'s (test_cli_train_eval.py's
  # test_resolve_sampling_and_drafter_errors), each exact in the library's tests.
  kwargs = dict(batch_sizes=(4,), gammas=(2,), table_drafters=("ngram",), table_gammas=(2,),
                limit=6, max_new_tokens=8, repeats=1, timing_steps=2, progress=False,
                compile_workers=2)
  res = R.run_results(workdir, R.ResultsSettings(**kwargs), config={"command": "pytest"},
                      on_update=lambda r: R.write_outputs(r, str(out)))
  paths = R.write_outputs(res, str(out))
  for p in paths.values():
    assert pathlib.Path(p).stat().st_size > 0
  assert res["skipped"] == ["aligned", "distilled"]
  rows = {r["key"]: r for r in res["rows"]}
  assert set(rows) == {"B4/target/greedy", "B4/target/sample", "B4/drafter/g2", "B4/ngram/g2"}
  base = rows["B4/target/greedy"]
  assert base["speedup"] == pytest.approx(1.0)   # the plain baseline (exact=False) itself
  assert base["exact_cost"] == pytest.approx(base["exact_baseline_ms_per_token"]
                                             / base["ms_per_token"])
  for key in ("B4/drafter/g2", "B4/ngram/g2"):
    r = rows[key]
    for col in ("alpha", "acceptance_rate", "block_efficiency", "ms_per_token", "speedup",
                "c", "verify_cost", "predicted_speedup", "measured_over_predicted", "bleu",
                "chrf"):
      assert r[col] is not None, (key, col)
    assert 0.0 <= r["alpha"] <= 1.0 and r["block_efficiency"] >= 1.0
    assert r["mismatching_rows"] == 0
    assert r["bleu"] == pytest.approx(base["bleu"]) and r["chrf"] == pytest.approx(base["chrf"])
  # c is a measured cost ratio: positive, never compared with a speed (a busy machine).
  assert all(rows[key]["c"] > 0 for key in ("B4/drafter/g2", "B4/ngram/g2"))
  assert "mismatching_rows" not in rows["B4/target/sample"]
  assert rows["B4/target/sample"]["speedup"] == 1.0    # its own baseline, not greedy's

  saved = json.loads((out / "results.json").read_text())
  assert len(saved["rows"]) == 4 and "4" in saved["costs"]
  md = (out / "results.md").read_text()
  header = "| " + " | ".join(R.TABLE_COLUMNS) + " |"
  assert header in md and "speculative greedy" in md and "target sampling (T=1)" in md
  assert (out / "speedup.png").read_bytes()[:4] == b"\x89PNG"

  # --resume: every row is present, nothing runs again; other settings are refused
  again = R.run_results(workdir, R.ResultsSettings(**kwargs), existing=saved)
  assert [r["wall_s"] for r in again["rows"]] == [r["wall_s"] for r in saved["rows"]]
  with pytest.raises(R.ResultsError, match="other settings"):
    R.run_results(workdir, R.ResultsSettings(**{**kwargs, "limit": 5}), existing=saved)


@pytest.mark.slow
def test_quality_table_every_model_alone_on_the_split(workdir, tmp_path):
  from specdec_jax_lab import evaluation
  q = R.run_quality(workdir, batch_size=4, progress=False)
  assert [(r["model"], r["method"]) for r in q["rows"]] == [
      ("target", "greedy"), ("target", "sampling (T=1)"), ("drafter", "greedy")]
  assert all(r["pairs"] == 10 for r in q["rows"])   # the whole split, not a timed subset
  # each row is that model's own decode: the drafter row is the drafter's greedy BLEU
  drafter = sd.load(str(workdir / "drafter" / "final"))
  alone = evaluation.evaluate(drafter, workdir / "data", evaluation.EvalSettings(batch_size=4))
  assert q["rows"][2]["bleu"] == pytest.approx(alone["bleu"])
  assert q["rows"][2]["params"] == drafter.num_params()
  paths = R.write_quality(q, str(tmp_path))
  assert json.loads(pathlib.Path(paths["json"]).read_text())["rows"][0]["model"] == "target"
  md = R.quality_markdown(q)
  assert "| drafter |" in md and "all 10 sentences" in md
  with pytest.raises(R.ResultsError, match="no target"):
    R.run_quality(tmp_path)


def test_splice_readme_replaces_only_the_marked_block(tmp_path):
  readme = tmp_path / "README.md"
  before = "# Title\n\nintro\n\n<!-- results:start -->\nold table\n| a |\n<!-- results:end -->\n"
  after = "\n## Next\ntext <!-- not a marker -->\n"
  readme.write_text(before + after)
  R.splice_readme(readme, "| new | table |\n|---|---|\n")
  text = readme.read_text()
  assert text == ("# Title\n\nintro\n\n<!-- results:start -->\n| new | table |\n|---|---|\n"
                  "<!-- results:end -->\n" + after)
  R.splice_readme(readme, "second")          # idempotent structure: markers kept
  assert readme.read_text().count("<!-- results:start -->") == 1
  assert "second\n<!-- results:end -->" in readme.read_text()
  assert "new | table" not in readme.read_text()

  readme.write_text("no markers\n")
  with pytest.raises(R.ResultsError, match="found 0 times"):
    R.splice_readme(readme, "x")
  readme.write_text("<!-- results:end -->\n<!-- results:start -->\n")
  with pytest.raises(R.ResultsError, match="before"):
    R.splice_readme(readme, "x")


def test_readme_block_links_plot_relative_to_readme(tmp_path):
  res = {"config": {"pairs": 3, "split": "test", "workdir": "w", "max_new_tokens": 4,
                    "batch_sizes": [8], "target_params": 1e6, "drafter_params": {},
                    "repeats": 1},
         "machine": {"jax_version": "x", "backend": "cpu", "device_kind": "cpu", "cpu_count": 2},
         "rows": [], "skipped": [], "command": None}
  block = R.readme_block(res, str(tmp_path / "results" / "demo" / "speedup.png"),
                         str(tmp_path / "README.md"))
  assert "![speedup vs gamma](results/demo/speedup.png)" in block
  assert "| batch | decoding |" in block


@pytest.mark.slow
def test_larger_pair_tables_by_name_in_bfloat16(workdir, tmp_path):
  """The larger target's table (`--name demo-large`): its aligned drafter variants, every
  model in bfloat16, the headline with c and verify cost from results/<name>, and README
  spliced from it; greedy output still the target's."""
  import shutil

  from specdec_jax_lab.results import __main__ as main
  from specdec_jax_lab.results import headline
  work = shutil.copytree(workdir, tmp_path / "work")
  shutil.copytree(work / "drafter", work / "aligned_small")
  readme = tmp_path / "README.md"
  readme.write_text(f"intro\n{R.START_MARKER}\nold\n{R.END_MARKER}\n")
  argv = ["--only", "demo", "--name", "demo-large", "--workdir", str(work), "--results-dir",
          str(tmp_path / "results"), "--readme", str(readme), "--limit", "4",
          "--batch-sizes", "1,2", "--gammas", "2", "--variants", "aligned_small",
          "--table-drafters", "", "--no-sampling", "--repeats", "1", "--timing-steps", "2",
          "--max-new-tokens", "6", "--dtype", "bfloat16", "--no-progress",
          "--compile-workers", "2"]
  assert main.main(argv) == 0
  out = tmp_path / "results" / "demo-large"
  res = json.loads((out / "results.json").read_text())
  assert res["config"]["dtype"] == "bfloat16" and res["skipped"] == []
  rows = {r["key"]: r for r in res["rows"]}
  assert set(rows) == {"B1/target/greedy", "B1/aligned_small/g2", "B2/target/greedy",
                       "B2/aligned_small/g2"}
  for b in (1, 2):
    r = rows[f"B{b}/aligned_small/g2"]
    assert r["mismatching_rows"] == 0 and r["c"] > 0 and r["verify_cost"] > 0
    assert r["verify_cost"] == pytest.approx(res["costs"][str(b)]["verify_cost"]["2"])
  quality = json.loads((out / "quality.json").read_text())
  assert quality["dtype"] == "bfloat16"
  assert [r["model"] for r in quality["rows"]] == ["target", "target", "aligned_small"]
  block = headline.headline(str(tmp_path / "results"), "demo-large")
  assert "| c | verify cost |" in block and "`aligned_small` the bundled 2M drafter" in block
  r = rows["B1/aligned_small/g2"]
  assert f"| {verify_cost_text(r['verify_cost'])} |" in block
  assert block in readme.read_text() and "old" not in readme.read_text()
  assert not (tmp_path / "results" / "demo").exists()
  with pytest.raises(R.ResultsError, match="other settings .*dtype"):
    R.run_results(work, R.ResultsSettings(batch_sizes=(1,), variants=("aligned_small",),
                                          gammas=(2,), table_drafters=(), limit=4,
                                          max_new_tokens=6, repeats=1, timing_steps=2,
                                          progress=False), existing=res)


# ----------------------------------------------------------------------------- timing noise


def _stored_results(verify_cost):
  row = {"key": "B1/aligned/g2", "method": "speculative", "batch_size": 1, "drafter": "aligned",
         "mode": "greedy", "gamma": 2, "alpha": 0.59, "acceptance_rate": 0.43,
         "block_efficiency": 1.69, "ms_per_token": 2.761, "speedup": 1.24, "c": 0.045,
         "verify_cost": verify_cost, "bleu": 9.5, "chrf": 27.9}
  row.update(costs.predictions(0.59, 2, 0.045, verify_cost, 1.24))
  # as an older run stored it: from the raw measurement
  row["predicted_speedup"] = float(theory.walltime_improvement_measured(0.59, 2, 0.045,
                                                                        verify_cost))
  base = {"key": "B1/target/greedy", "method": "baseline", "batch_size": 1, "drafter": None,
          "mode": "greedy", "gamma": None, "ms_per_token": 3.256, "speedup": 1.0,
          "bleu": 9.5, "chrf": 27.9}
  return {"created": "2026-11-25T18:49:08+00:00", "command": "python -m ...",
          "config": {"pairs": 100, "max_new_tokens": 20},
          "machine": {"backend": "cpu", "cpu_count": 2, "jax_version": "0.10.2"},
          "rows": [base, row]}


@pytest.mark.parametrize("verify_cost", [0.9, 1.21])
def test_results_tables_show_noise_as_noise(tmp_path, verify_cost):
  res = _stored_results(verify_cost)
  (tmp_path / "demo").mkdir()
  (tmp_path / "demo" / "results.json").write_text(json.dumps(res))
  speed = "\n".join(headline.speed_table(str(tmp_path), "demo"))
  table = markdown_table(res)
  predicted = costs.predictions(0.59, 2, 0.045, verify_cost, 1.24)["predicted_speedup"]
  for text in (speed, table):
    assert f"| {costs.verify_cost_text(verify_cost)} |" in text
    assert f"{predicted:.2f}x" in text                  # floored, whatever was stored
    assert ("timing noise" in text) == (verify_cost < 1.0)
    assert "0.90" not in text
