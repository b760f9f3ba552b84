"""The one exception type of the checkpoints package (defined with the others in `errors`)."""

from specdec_jax.errors import CheckpointError

__all__ = ["CheckpointError"]
