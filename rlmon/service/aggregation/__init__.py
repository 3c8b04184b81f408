"""Aggregation: fold every rank's partials into one finalized step, exactly once, on time, across
restarts and merge tiers.
"""
