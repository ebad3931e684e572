"""Pre-training: train state, optimizer and schedules, the jitted steps, stages, perf accounting and the loop."""
