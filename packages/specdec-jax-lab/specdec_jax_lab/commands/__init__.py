"""The `specdec` subcommands of the lab: each module's `add(subparsers)` adds its parser,
registered in pyproject.toml under the entry-point group `specdec_jax.commands`."""
