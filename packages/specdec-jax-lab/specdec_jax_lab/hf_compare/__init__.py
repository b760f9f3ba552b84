"""Side by side with Hugging Face transformers on the SAME weights, in one process.

Both models (our `Model`s, or paths `sd.load` reads) are exported with
`checkpoints.export_hf` into temporary directories and loaded with
`T5ForConditionalGeneration.from_pretrained(dir, dtype=torch.float32)` in eval mode
(torch's thread count is left at its default). A decoder-only pair (a Gemma 4 target
and its assistant `sd.GemmaAssistant`, or a smaller Gemma 4) is given as its
transformers directories: `sd.load` reads them for ours and
`AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32)` for HF's, whose
output rows are cut after the prompt; EOS and pad are the target's, passed to
`generate`. On the same prompts the methods are:

* `hf_greedy`: `generate(do_sample=False, num_beams=1, max_new_tokens=N)`, batch 1;
* `hf_assisted`: the same with `assistant_model=<HF drafter>`, batch 1 (transformers'
  assisted generation runs batch 1 only). The assistant's `generation_config` gets
  `num_assistant_tokens=gamma`, `num_assistant_tokens_schedule="constant"` and
  `assistant_confidence_threshold=0` (no early stop of a draft), so that each round
  drafts exactly gamma tokens as ours does;
* `hf_assisted_default`: assisted generation with transformers' own defaults (a
  fresh assistant; the values in use are recorded under config.hf_default_assisted; a
  decoder-only drafter: the settings its directory's generation config holds);
* `ours_greedy` / `ours_speculative` at batch 1: `sd.generate` and
  `sd.speculative_generate(gamma)` on each prompt alone (prompts 0-padded to one
  length, so one compiled shape; padding is masked and does not change outputs);
* `ours_greedy_bB` / `ours_speculative_bB` for each batch size B (e.g. 8, 32): the
  prompts in batches of B rows (`batching.padded_batches`: the last batch padded by
  repeating its final prompt; padding rows are not counted).

Each method is called once first (warm-up, compilation; excluded), then `repeats`
rounds call every method once, the order rotated by one per round; the median round
time is reported. A "call" of a method decodes ALL prompts (batch 1: one generate per
prompt, the way a user would call it).

* ms/token = median wall time of one call / tokens it generated for the prompts (EOS
  included; HF's decoder start token, padding and padding rows are not counted).
* speedup vs HF greedy / vs our greedy = that method's ms/token over this one's.
* identical: the greedy tokens of every prompt equal `hf_greedy`'s token for token
  (HF rows are cut after the decoder start token, or the prompt, and at their first
  EOS); `identical_per_prompt` says it prompt by prompt.
* tokens/target call: ours from our statistics (`stats.merge_outputs`: target calls
  counted per row); HF's from `hf_target_calls`, HF's own target forward passes
  counted with a forward hook in one extra untimed call (batch 1: one row per pass).

Any method that fails (load, warm-up) is recorded with its error text instead of
stopping the comparison. With a Gemma 4 assistant the report carries a note: after a
rejected draft transformers' assistant reads other keys than ours (see
docs/models/gemma4.md), so tokens are compared (the target's greedy output either
way) while drafts, acceptance and tokens per target call may differ.

    results = compare(target, drafter, prompts, CompareSettings(gamma=4, max_new_tokens=32))
    write_report(results, "results/hf_compare")   # hf_compare.json, hf_compare.md
"""

from specdec_jax.batching import pad_rows
from specdec_jax_lab.errors import CompareError
from specdec_jax_lab.hf_compare import hf
from specdec_jax_lab.hf_compare.compare import (
  DEFINITIONS,
  SCHEMA_VERSION,
  CompareSettings,
  compare,
  first_difference,
  our_method,
  our_row_tokens,
  prompt_rows,
)
from specdec_jax_lab.hf_compare.hf import (
  CallCounter,
  hf_method,
  hf_row_tokens,
  load_hf,
  load_hf_from_dir,
)
from specdec_jax_lab.hf_compare.report import (
  markdown_report,
  markdown_table,
  per_prompt_table,
  write_report,
)

DESCRIPTION = __doc__.split("\n\n    results =")[0]

__all__ = ["CallCounter", "CompareError", "CompareSettings", "DEFINITIONS", "DESCRIPTION",
           "SCHEMA_VERSION", "compare", "first_difference", "hf", "hf_method", "hf_row_tokens",
           "load_hf", "load_hf_from_dir", "markdown_report", "markdown_table", "our_method",
           "our_row_tokens", "pad_rows", "per_prompt_table", "prompt_rows", "write_report"]
