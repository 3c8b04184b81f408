"""Goodput: where a run's GPU-hours go (productive, overhead, idle, wasted), from the step
timelines, and what each alert has cost since its onset (docs/goodput.md)."""
