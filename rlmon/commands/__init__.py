"""Subcommands of the ``rlmon`` CLI, one module each; every module exposes ``register``."""
