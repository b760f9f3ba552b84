"""Proposers: whatever drafts tokens for the target to verify.

    ModelDrafter(model)            a smaller model of the target's kind (T5 or decoder-only)
    NGramDrafter.fit(sequences)    unigram / bigram tables (cost c ~ 0)
    PromptLookupDrafter(V)         copies continuations of matching n-grams from the input
    GemmaAssistant                 a Gemma 4 target's assistant (`sd.load` of its dir):
                                   drafts from the target's cache and final state

These are token-level drafters (`protocol.Drafter`: vocab_size, init / first / next);
`as_proposer` wraps one in a `DraftLoop`, the proposer the round engine calls. A proposer
written from scratch (prediction heads, ...) implements `rounds.phases.Proposer`. Both are
checked here, before any tracing (docs/extending/drafter.md).
"""

from __future__ import annotations

from typing import Any

from specdec_jax.drafters.assistant import GemmaAssistant
from specdec_jax.drafters.lookup import LookupState, PromptLookupDrafter
from specdec_jax.drafters.loop import DraftLoop, DraftState, NoProposals, Unsure
from specdec_jax.drafters.model import ModelDrafter
from specdec_jax.drafters.ngram import NGramDrafter
from specdec_jax.drafters.protocol import Drafter, check_drafter, check_proposer
from specdec_jax.errors import InputError
from specdec_jax.models.model import Model, family
from specdec_jax.rounds.phases import Proposer
from specdec_jax.rounds.requests import check_same_vocabulary

__all__ = ["DraftLoop", "DraftState", "Drafter", "GemmaAssistant", "LookupState",
           "ModelDrafter", "NGramDrafter",
           "NoProposals", "PromptLookupDrafter", "Unsure", "as_drafter", "as_proposer"]


def as_drafter(drafter: Any, target: Model) -> Drafter:
  """A `Model` becomes a `ModelDrafter`; token-level drafters pass through, checked: their
  members (`Drafter`), that they are pytrees, and the vocabulary."""
  if isinstance(drafter, Model):
    drafter = ModelDrafter(drafter)
  if callable(getattr(drafter, "for_target", None)):
    raise InputError(f"{type(drafter).__name__} is a proposer that drafts from its target's "
                     "own cache and states, not a token-level drafter: use it with "
                     "sd.Speculative(drafter, gamma=...)")
  check_drafter(drafter, target.is_decoder_only)
  check_same_vocabulary(target.config.vocab_size, drafter.vocab_size)
  check_same_family(target, getattr(drafter, "model", None))
  return drafter


def check_same_family(target: Model, model: Any) -> None:
  """A drafting model must be of the target's kind: both T5 encoder-decoders (reading the
  same source sentence) or both decoder-only LMs (continuing the same prompt)."""
  if not isinstance(model, Model) or model.is_decoder_only == target.is_decoder_only:
    return
  raise InputError(f"the drafter is {family(model)} but the target is {family(target)}: a "
                   "drafting model must be of the target's kind (an LM drafts for an LM, "
                   "a T5 for a T5)")


def as_proposer(proposer: Any, target: Model) -> Proposer:
  """A proposer passes through (checked: `rounds.phases.Proposer`, a pytree, the vocabulary);
  a `Model` or token-level drafter is wrapped in a `DraftLoop`. A value with a `propose`
  is taken for a proposer, anything else for a drafter. A proposer that reads the target
  itself (`GemmaAssistant`) has a `for_target(target)`: it checks the target and returns
  the proposer bound to it."""
  if hasattr(proposer, "propose") and not isinstance(proposer, Model):
    if callable(getattr(proposer, "for_target", None)):
      proposer = proposer.for_target(target)
    check_proposer(proposer, target.is_decoder_only)
    check_same_vocabulary(target.config.vocab_size, proposer.vocab_size)
    inner = getattr(proposer, "drafter", None)
    check_same_family(target, getattr(inner, "model", None))
    return proposer
  return DraftLoop(as_drafter(proposer, target))
