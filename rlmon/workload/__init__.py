"""A small, real GRPO workload (numpy) for the demo and the bundled example run."""
