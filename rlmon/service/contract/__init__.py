"""The contract between ranks and rlmon: partial-report records, the per-step message, timelines,
finalized step records, the stop decision.
"""
