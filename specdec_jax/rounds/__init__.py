"""The round engine and what every round hands around, below the drafters and the methods.

    phases      the typed hand-offs of a round (RoundContext, Proposal, Verified,
                Acceptance, RoundOutcome) and the two protocols a method plugs in
                (Proposer, AcceptRule)
    engine      RoundConfig, RoundState and the pure functions of one round (propose ->
                verify -> accept -> commit -> count), `run`: one jitted lax.while_loop
    acceptance  the acceptance rules (greedy, speculative sampling, BiLD's rollback)
    buffer      the token buffer [B, T + 1] every method emits into, and DecodeOutput
    stats       the per-row counters and the statistics summarised from them
    requests    checks of a decode request (prompts, lengths, vocabularies, rng)

`drafters/` (proposers) and `methods/` (the method values and their wirings) build on
this package; nothing here imports either.
"""
