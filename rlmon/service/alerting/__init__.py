"""Alerting: rules as data, the engine evaluating them on finalized steps, baselines, the sanity
layer, notifications.
"""
