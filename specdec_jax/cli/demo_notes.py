"""What a bundled demo model is, said beside its outputs so that nobody mistakes a toy
translation for the library's quality.

    demo_note("demo-de-en-large/target")
    # "demo-de-en-large is a De→En demo pair: a 48.6M-parameter target trained on a
    #  laptop-scale dictionary corpus, test BLEU 10.4; it shows speed and exactness, not
    #  translation quality"
"""

from __future__ import annotations

#: Bundled group -> what it is (figures: packages/specdec-jax-lab/results/*/quality.md and
#: results/lm-demo/alpha.md there).
DEMOS = {
    "demo-de-en": ("De→En demo pair: a 13.5M-parameter target trained on a laptop-scale "
                   "dictionary corpus, test BLEU 8.3", "translation quality"),
    "demo-de-en-large": ("De→En demo pair: a 48.6M-parameter target trained on a "
                         "laptop-scale dictionary corpus, test BLEU 10.4",
                         "translation quality"),
    "demo-en-lm": ("English demo pair: a 5.0M-parameter LM trained on a laptop-scale "
                   "dictionary corpus, perplexity 76", "text quality"),
}


def demo_note(*names: str | None) -> str | None:
  """One line saying what the first bundled demo group among `names` (model names as
  given on the command line) is; None when none is a demo."""
  for name in names:
    group = str(name or "").split("/", 1)[0]     # "demo-de-en" of "demo-de-en/target"
    if group in DEMOS:
      what, quality = DEMOS[group]
      return (f"{group} is a {what}; it is here for speed and exactness, not "
              f"{quality}")
  return None
