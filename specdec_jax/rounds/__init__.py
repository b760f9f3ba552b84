"""What every round hands around, below both the drafters and the decoding methods.

    phases    the typed hand-offs of a round (RoundContext, Proposal, Verified,
              Acceptance, RoundOutcome) and the two protocols a method plugs in
              (Proposer, AcceptRule)
    buffer    the token buffer [B, T + 1] every method emits into, and DecodeOutput

`drafters/` (proposers) and `decoding/` (the engine, the acceptance rules, the methods)
both import from here; nothing here imports either (DecodeOutput summarises with
`decoding.stats`, a leaf module).
"""
