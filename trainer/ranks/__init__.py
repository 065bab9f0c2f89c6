"""What keeps the ranks of one run together: the per-step agreement, the step clock, failure reports,
preemption signals and a spawned run's result."""
