"""Experimental methods: exact and tested as the others, but research, not yet a peer of
the methods in `sd` (their settings, statistics and names may change in any release).

    from specdec_jax import experimental
    out = sd.decode(target, experimental.SpeculativeBeam(drafter, num_beams=4, gamma=3),
                    inputs, max_new_tokens=T)

    speculative_beam  exact speculative beam search (SpeculativeBeam): `sd.Beam`'s beams,
                      bitwise, with fewer target calls when a drafter predicts them; its
                      phases (`init`, `draft`, `verify`, `replay`, `commit`, `finish`)
                      are pure functions over one `State`, for research code

Above `methods` (they are method values like those, `sd.decode` runs them); `sd` does not
export them, and `sd.methods.METHODS` lists the stable methods only: `METHODS` here lists
these, and the CLI and the tests' registry (`specdec_jax.testing.examples`) take both.
"""

from specdec_jax.experimental import speculative_beam
from specdec_jax.experimental.speculative_beam import SpeculativeBeam, SpeculativeBeamOutput

#: The experimental method types (`sd.methods.METHODS`: the stable ones).
METHODS = (SpeculativeBeam,)

__all__ = ["METHODS", "SpeculativeBeam", "SpeculativeBeamOutput", "speculative_beam"]
