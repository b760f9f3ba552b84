"""Distil the bundled demo drafter on the target's softmax, for exact speculative beam search.

    python packages/specdec-jax-lab/scripts/distill_beam_drafter.py \
        --workdir runs/beam-drafter STAGE [STAGE ...]

Stages (each writes under --workdir and reads what the earlier ones wrote):

  data     the demo recipe's TRAIN split (configs/demo/train.json's data settings: Debian's
           trans-de-en, min 2 German words, hash split seed 0, 20 tokens at most), German
           texts that also occur in the validation or test split or in
           tests/data/demo_test_pairs.jsonl dropped, tokenised with the BUNDLED tokenizer
           (`sd.load_tokenizer("demo-de-en")`), shuffled: data.npz inputs [N, 20].
  teacher  teacher sequences of the bundled target (float32) for the first --examples
           inputs: its greedy output, and with --beam-examples its K = 4 beams
           (`sd.Beam(4, 0.6)`) for the first ones, each beam a sequence of its own (the
           prefixes speculative beam search drafts from): teacher.npz inputs / targets.
  train    fine-tune `demo-de-en/drafter` (float32) with soft-target distillation: cross-
           entropy against the target's softmax at temperature 1 on every position of the
           teacher sequences (`specdec_jax_lab.training.train(..., teacher=target)`,
           DistillSpec's on-policy data + KL), Adafactor, batch 64, length buckets of 4.
  save     the trained drafter in the bundled format (bfloat16 params.safetensors +
           specdec_config.json) to WORKDIR/drafter.
  measure  on the 8 first pairs of tests/data/demo_test_pairs.jsonl, bundled target in
           bfloat16, for `demo-de-en/drafter` and WORKDIR/drafter (both bfloat16): greedy
           agreement alpha (`sd.Speculative(drafter, gamma=1)`'s acceptance_rate, batch 1,
           32 new tokens) and s, beam steps per target call, of
           `experimental.SpeculativeBeam` (beam 4 / alpha 0.6, 32 new tokens, batch 1, first
           level width 16) at gamma 1 with M = 12 and 16 chains and gamma 2 with M = 16
           (beams checked equal to `sd.Beam`'s), and each drafter's own greedy output on 3
           sentences: WORKDIR/measure.json.

The recorded run (2026-11-28, 2 CPU cores shared with other jobs, jax 0.10.2), the defaults:

    P="python packages/specdec-jax-lab"
    $P/scripts/distill_beam_drafter.py data teacher      # 103,601 inputs; greedy for 24,000
                                                         # (295 s), 4 beams for 8,000 (161 s):
                                                         # 51,628 distinct pairs
    $P/scripts/distill_beam_drafter.py train save measure --steps 4000   # 1447 s
    $P/scripts/distill_beam_drafter.py train save measure                # on to 8000: 1556 s
    $P/scripts/distill_beam_drafter.py measure --sentences 64

(the second leg resumes the first's checkpoint; one run of 8000 steps trains the same).
Loss (soft cross-entropy, the target's entropy included; mean of the last 10 logged
batches): 3.24 at 4000 steps, 3.19 at 8000. Held-out sentences, bfloat16, beam 4 / alpha
0.6, 32 new tokens, batch 1, width 16; alpha: greedy acceptance of sd.Speculative(gamma=1);
s: beam steps per target call (every beam equal to sd.Beam's in every row):

    drafter                     sentences  alpha   s g1 M12   s g1 M16   s g2 M16
    demo-de-en/drafter (BiLD)   8          0.667   1.506      1.600      1.620
    distilled, 4000 steps       8          0.667   1.662      1.730      1.778
    distilled, 8000 steps       8          0.574   1.684      1.707      1.778
    demo-de-en/drafter (BiLD)   64         0.677   1.486      1.531      1.618
    distilled, 4000 steps       64         0.684   1.646      1.688      1.776
    distilled, 8000 steps       64         0.699   1.643      1.702      1.780

So +0.16 beam steps per call at every shape over the bundled drafter, the same 2.0M
parameters; short of the target with noise 0.15 on its weights (s 1.94 at g1 M12, 8
sentences). 8 sentences are noisy (alpha 0.574 vs 0.699 on 64); 4000 more steps changed
little.

More capacity (2026-11-28): a new drafter of 3.2M parameters, random weights, the same data,

    echo '{"vocab_size": 8000, "emb_dim": 128, "num_heads": 2, "head_dim": 64,
      "mlp_dim": 512, "num_encoder_layers": 2, "num_decoder_layers": 2,
      "mlp_activations": ["gelu", "linear"], "logits_via_embedding": false,
      "dropout_rate": 0.0}' > big.json
    $P/scripts/distill_beam_drafter.py train save measure --drafter-config big.json \
        --steps 6000 --learning-rate 0.01 --decay-start 1000       # 3971 s, loss 3.17
    $P/scripts/distill_beam_drafter.py measure --sentences 64

    3.2M from scratch           8          0.574   1.662      1.730      1.803
    3.2M from scratch           64         0.698   1.634      1.678      1.765

the fine-tuned 2.0M drafter's figures: capacity is not what this recipe lacks.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

import specdec_jax as sd

SCRIPTS = pathlib.Path(__file__).resolve().parent
REPO = SCRIPTS.parents[2]                 # the repository (configs/, tests/data)
PAIRS = REPO / "tests" / "data" / "demo_test_pairs.jsonl"
RECIPE = REPO / "configs" / "demo" / "train.json"
MAX_LEN = json.loads(RECIPE.read_text())["data"]["max_len"]   # the inputs' and outputs' tokens
K, ALPHA = 4, 0.6
STAGES = ("data", "teacher", "train", "save", "measure")


def log(*args) -> None:
  print(time.strftime("%H:%M:%S"), *args, file=sys.stderr, flush=True)


def build_data(workdir: pathlib.Path, seed: int = 0) -> None:
  """The train split's German inputs, tokenised with the bundled tokenizer: data.npz."""
  from specdec_jax_lab.data import de_en, prepare
  settings = json.loads(RECIPE.read_text())["data"]
  pairs = de_en.filter_pairs(de_en.load_pairs(de_en.DEFAULT_PATH),
                             min_words_de=settings["min_words_de"])
  splits = de_en.split_pairs(pairs, seed=settings["seed"])
  held_out = {p.de for name in ("validation", "test") for p in splits[name]}
  held_out |= {json.loads(line)["de"] for line in PAIRS.read_text().splitlines()}
  train = [p for p in splits["train"] if p.de not in held_out]
  tok = sd.load_tokenizer("demo-de-en")
  inputs, _, kept = prepare.encode_split(tok, train, MAX_LEN)
  # One input per German text (the dictionary repeats a text with other translations).
  _, first = np.unique(inputs, axis=0, return_index=True)
  inputs = inputs[np.sort(first)]
  inputs = inputs[np.random.default_rng(seed).permutation(len(inputs))]
  np.savez(workdir / "data.npz", inputs=inputs)
  log(f"data: {len(splits['train'])} train pairs, {len(train)} after held-out German, "
      f"{len(kept)} within {MAX_LEN} tokens, {len(inputs)} distinct inputs")


def _batched(fn, inputs: np.ndarray, batch_size: int) -> np.ndarray:
  from specdec_jax.batching import padded_batches
  outs = []
  for i, b in enumerate(padded_batches(inputs, batch_size)):   # one compiled shape
    outs.append(np.asarray(fn(b.tokens))[:b.real])
    if i % 10 == 0:
      log(f"  batch {i + 1}/{-(-len(inputs) // batch_size)}")
  return np.concatenate(outs)


def build_teacher(workdir: pathlib.Path, examples: int, beam_examples: int,
                  batch_size: int) -> None:
  """The target's greedy outputs (and K beams for the first `beam_examples`): teacher.npz."""
  with np.load(workdir / "data.npz") as d:
    inputs = d["inputs"][:examples]
  target = sd.load("demo-de-en/target", dtype="float32")
  start = time.time()
  greedy_method = sd.Autoregressive(exact=False)    # no padded calls: a teacher, not a check
  greedy = _batched(lambda x: sd.decode(target, greedy_method, x, max_new_tokens=MAX_LEN).tokens,
                    inputs, batch_size)
  log(f"teacher: greedy for {len(inputs)} inputs in {time.time() - start:.0f} s")
  ins, outs = [inputs], [greedy]
  if beam_examples:
    start = time.time()
    part = inputs[:beam_examples]
    beams = _batched(lambda x: sd.decode(target, sd.Beam(num_beams=K, alpha=ALPHA), x,
                                         max_new_tokens=MAX_LEN).beams,
                     part, max(batch_size // K, 1))                    # [N, K, T]
    ins.append(np.repeat(part, K, axis=0))
    outs.append(beams.reshape(-1, MAX_LEN))
    log(f"teacher: {K} beams for {len(part)} inputs in {time.time() - start:.0f} s")
  inputs, targets = np.concatenate(ins), np.concatenate(outs).astype(np.int32)
  pairs = np.unique(np.concatenate([inputs, targets], 1), axis=0)   # a beam = greedy: once
  pairs = pairs[np.random.default_rng(1).permutation(len(pairs))]
  pairs = pairs[(pairs[:, MAX_LEN:] > 0).any(1)]
  np.savez(workdir / "teacher.npz", inputs=pairs[:, :MAX_LEN], targets=pairs[:, MAX_LEN:])
  log(f"teacher: {len(pairs)} distinct (input, sequence) pairs")


def train_drafter(workdir: pathlib.Path, steps: int, learning_rate: float,
                  decay_start: int | None = None, drafter_config: str | None = None) -> None:
  """Soft-target distillation on teacher.npz of the bundled drafter, or with
  `drafter_config` of a new model of that config (a JSON file like configs/demo/*.json)
  from random weights. Resumable: a rerun with more `steps` and the same `decay_start`
  continues from the last checkpoint."""
  from specdec_jax.io.checkpoints import save_checkpoint
  from specdec_jax_lab import training
  with np.load(workdir / "teacher.npz") as d:
    inputs, targets = d["inputs"], d["targets"]
  target = sd.load("demo-de-en/target", dtype="float32")
  if drafter_config is None:
    drafter = sd.load("demo-de-en/drafter", dtype="float32")
  else:
    drafter = sd.init_model(sd.get_config(drafter_config), 3)
  log(f"train: a drafter of {drafter.num_params()} parameters")
  cfg = training.TrainConfig(steps=steps, batch_size=64, optimizer="adafactor",
                             learning_rate=learning_rate, warmup_steps=100,
                             decay_start=steps // 3 if decay_start is None else decay_start,
                             length_bucket=4, checkpoint_every=250,
                             seed=3, distill_temperature=1.0)
  start = time.time()
  model, history = training.train(drafter, inputs, targets, cfg, workdir / "train",
                                  teacher=target)
  seconds = time.time() - start
  save_checkpoint(str(workdir / "final"), model.config, model.params)
  (workdir / "final" / "train_log.json").write_text(json.dumps(
      {"steps": steps, "seconds_this_run": seconds, "examples": len(inputs),
       "history": history[-40:]}, indent=1))
  log(f"train: {steps} steps in {seconds:.0f} s, last {history[-1]}")


def save_drafter(workdir: pathlib.Path) -> None:
  from specdec_jax.io.checkpoints import save_checkpoint
  model = sd.load(str(workdir / "final"))
  save_checkpoint(str(workdir / "drafter"), model.config, model.params, dtype="bfloat16")
  log(f"save: {workdir / 'drafter'} ({model.num_params()} params)")


def measure(workdir: pathlib.Path, sentences: int, max_new_tokens: int, width: int) -> None:
  sys.path.insert(0, str(SCRIPTS))
  from project_speculative_beam import greedy_agreement, steps_per_call
  target = sd.load("demo-de-en/target", dtype="bfloat16")
  tok = sd.load_tokenizer("demo-de-en")
  lines = [json.loads(line) for line in PAIRS.read_text().splitlines()[:sentences]]
  enc = np.asarray(tok.encode([p["de"] for p in lines]))
  shapes = ((1, 12), (1, 16), (2, 16))      # (gamma, chains M)
  results = {}
  for name, path in (("bundled", "demo-de-en/drafter"), ("distilled", str(workdir / "drafter"))):
    drafter = sd.load(path, dtype="bfloat16")
    start = time.time()
    row: dict = {"drafter": path, "num_params": drafter.num_params(),
                 "alpha": greedy_agreement(target, drafter, enc, max_new_tokens)}
    for gamma, chains in shapes:
      r = steps_per_call(target, drafter, enc, 1, gamma, chains, max_new_tokens, width)
      row[f"gamma{gamma}_M{chains}"] = r
    own = sd.decode(drafter, sd.Autoregressive(), enc[:3], max_new_tokens=max_new_tokens)
    row["greedy_own"] = tok.decode(np.asarray(own.tokens))
    row["seconds"] = time.time() - start
    results[name] = row
    log(name, json.dumps(row, indent=1))
  results["setup"] = {"sentences": sentences, "max_new_tokens": max_new_tokens, "width": width,
                      "batch": 1, "num_beams": K, "alpha": ALPHA, "dtype": "bfloat16",
                      "inputs": [p["de"] for p in lines[:3]]}
  (workdir / "measure.json").write_text(json.dumps(results, indent=1, ensure_ascii=False))
  for name in ("bundled", "distilled"):
    r = results[name]
    print(f"{name}: alpha {r['alpha']:.3f}  " + "  ".join(
        f"s(gamma {g}, M {m}) {r[f'gamma{g}_M{m}']['steps_per_target_call']:.3f}"
        for g, m in shapes) + f"  beams equal: "
        f"{all(r[f'gamma{g}_M{m}']['beams_equal'] for g, m in shapes)}")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("stages", nargs="+", choices=STAGES)
  parser.add_argument("--workdir", default="runs/beam-drafter")
  parser.add_argument("--examples", type=int, default=24000,
                      help="train inputs the target decodes greedily")
  parser.add_argument("--beam-examples", type=int, default=8000,
                      help="of those, how many also give the target's K beams")
  parser.add_argument("--batch-size", type=int, default=512, help="teacher decode batch")
  parser.add_argument("--steps", type=int, default=8000)
  parser.add_argument("--learning-rate", type=float, default=5e-3)
  parser.add_argument("--decay-start", type=int, default=1333,
                      help="inverse-sqrt decay from this step (the recorded run: 1333)")
  parser.add_argument("--drafter-config", default=None,
                      help="train a new drafter of this config (JSON) from random weights "
                           "instead of fine-tuning demo-de-en/drafter")
  parser.add_argument("--sentences", type=int, default=8)
  parser.add_argument("--max-new-tokens", type=int, default=32)
  parser.add_argument("--width", type=int, default=16)
  args = parser.parse_args()
  workdir = pathlib.Path(args.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  for stage in args.stages:
    if stage == "data":
      build_data(workdir)
    elif stage == "teacher":
      build_teacher(workdir, args.examples, args.beam_examples, args.batch_size)
    elif stage == "train":
      train_drafter(workdir, args.steps, args.learning_rate, args.decay_start,
                    args.drafter_config)
    elif stage == "save":
      save_drafter(workdir)
    else:
      measure(workdir, args.sentences, args.max_new_tokens, args.width)
  return 0


if __name__ == "__main__":
  sys.exit(main())
