"""Pure-Python core of rlmon (no Ray import): catalog, partial merge, step assembly, alerting."""
