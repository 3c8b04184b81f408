"""Everything of rlmon that imports Ray: the Reporter, the Aggregator and the service actors."""
