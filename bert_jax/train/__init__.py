"""Train state, optimizer and schedules, the jitted steps, perf accounting and the loop."""
