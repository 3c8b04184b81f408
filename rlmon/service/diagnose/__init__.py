"""Diagnose the runs a team already has: logs that training left behind, read back offline.

``rlmon diagnose PATH...`` (docs/diagnose.md) reads TensorBoard event files, W&B offline runs and
history exports, Hugging Face ``trainer_state.json``, verl's file logger and rlmon's own files,
maps their keys with the framework key maps and runs the alert rules and the sanity layer over
the steps.
"""
