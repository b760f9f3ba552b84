"""Checkpoints and tokenizers: reading and writing what models are made of."""
