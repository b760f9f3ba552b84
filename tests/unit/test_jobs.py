"""A decode job's batches are sized in one place (`jobs.plan`), and encoded prompts fit
their model (`Prompts.fit`): the budget an LM's positions leave, the note on T5 ids."""

from __future__ import annotations

import dataclasses
import types
from typing import NamedTuple

import jax
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax.io.prompts import Prompts
from specdec_jax.runs import Corpus, Run
from specdec_jax.runtime import jobs
from specdec_jax.runtime.jobs import Job, plan

pytestmark = pytest.mark.unit

LM = types.SimpleNamespace(max_positions=8, eos_id=1, pad_id=0, vocab_size=32,
                           is_decoder_only=True)
T5 = types.SimpleNamespace(eos_id=1, pad_id=0, vocab_size=32, is_decoder_only=False)


def test_plan_sizes_the_batch_once():
  tokens = np.zeros((3, 40), np.int32)
  tokens[0, :12], tokens[1, :3], tokens[2, :2] = 5, 6, 7
  prompts = Prompts(tokens)
  run = Run(sd.Autoregressive())
  whole = plan(run, prompts, Job(max_new_tokens=4))
  assert whole.batch == 3 and [b.real for b in whole.batches] == [3]
  assert whole.lengths is None and whole.steps == [(0,)] and not whole.split
  two = plan(run, prompts, Job(max_new_tokens=4, batch_size=2))
  assert two.batch == 2 and [b.real for b in two.batches] == [2, 1]
  # each batch trimmed to its own longest prompt's bucket, never past the input
  assert [b.tokens.shape for b in two.batches] == [(2, 16), (2, 8)]


def test_an_lm_budget_is_lowered_to_fit_its_positions():
  prompts = Prompts.encode(["5 6 7", "5"], None, LM)
  assert prompts.lengths.tolist() == [3, 1]
  assert prompts.fit(4, LM) == (4, None)
  budget, note = prompts.fit(10, LM)
  assert budget == 5 and "lowered to 5" in note and "holds 3 tokens" in note
  with pytest.raises(sd.SpecdecError, match="prompt 1 holds 8 tokens"):
    Prompts.encode(["5 " * 8], None, LM).fit(2, LM)


def test_t5_ids_without_eos_are_noted():
  assert Prompts.encode(["5 6 1"], None, T5).fit(4, T5) == (4, None)
  budget, note = Prompts.encode(["5 6 1", "5 6", "7"], None, T5).fit(4, T5)
  assert budget == 4 and note.startswith("prompts 2, 3 do not end in EOS (1)")


def test_plan_deals_a_files_batches_and_splits_stdout_by_blocks(monkeypatch):
  # process 1 of 2, 5 rows in batches of 2; each batch keyed by its index in `batches`
  monkeypatch.setattr(jobs.jax, "process_count", lambda: 2)
  monkeypatch.setattr(jobs.jax, "process_index", lambda: 1)
  prompts = Prompts(np.arange(1, 6, dtype=np.int32)[:, None])
  run = Run(sd.Autoregressive())
  file = plan(run, prompts, Job(max_new_tokens=4, batch_size=2, output="out.txt"))
  rows = lambda p: [b.tokens[:b.real, 0].tolist() for b in p.batches]
  # the file's batches dealt out: step s decodes batches 2s (process 0) and 2s + 1
  assert rows(file) == [[1, 2], [3, 4], [5]] and file.me == 1
  assert file.steps == [(0, 1), (2, 3)]      # 3: past the end
  # stdout's: each process its block of rows (process 1: rows 4, 5), keyed after process 0's
  out = plan(run, prompts, Job(max_new_tokens=4, batch_size=2))
  assert rows(out) == [[1, 2], [3], [4, 5], []]
  assert out.steps == [(0, 2), (1, 3)] and out.split


class _Out(NamedTuple):
  tokens: np.ndarray
  lengths: np.ndarray


def test_one_loop_keys_each_batch_by_its_index_to_stdout_and_to_a_file(monkeypatch, tmp_path,
                                                                        capsys):
  seen = []

  def decode_corpus(run, target, batches, *, max_new_tokens, rng, prompt_lengths, first_key):
    (b,) = batches            # one batch a step; its output row: the prompt + 100 * its key
    seen.append((int(b.tokens[0, 0]), first_key, np.array_equal(rng, jax.random.PRNGKey(7))))
    return Corpus((_Out(b.tokens[:, :1] + 100 * first_key, np.ones(2, np.int32)),), (b.real,))
  monkeypatch.setattr(jobs, "decode_corpus", decode_corpus)
  prompts = Prompts(np.arange(1, 6, dtype=np.int32)[:, None])     # batches [1 2] [3 4] [5]
  run, target = Run(sd.Autoregressive()), types.SimpleNamespace(params={})
  job = Job(max_new_tokens=1, seed=7, batch_size=2, warmup=False, stream=True,
            lines=tuple("abcde"))
  keyed = [(1, 0, True), (3, 1, True), (5, 2, True)]
  corpus, _, _, sink, start = jobs.decode_plan(run, target, prompts, job)
  assert seen == keyed and corpus.token_rows() == [[1], [2], [103], [104], [205]]
  assert capsys.readouterr().out == "1\n2\n103\n104\n205\n" and (sink.rows, start) == (5, 0)
  out, seen[:] = tmp_path / "out.txt", []
  to_file = dataclasses.replace(job, stream=False, output=str(out))
  jobs.decode_plan(run, target, prompts, to_file)
  assert seen == keyed and out.read_text() == "1\n2\n103\n104\n205\n"
  out.write_text("1\n2\n103\n")       # resumed: from the batch holding row 3, with its key
  seen[:] = []
  *_, start = jobs.decode_plan(run, target, prompts, dataclasses.replace(to_file, resume=True))
  assert seen == keyed[1:] and start == 3 and out.read_text() == "1\n2\n103\n104\n205\n"
