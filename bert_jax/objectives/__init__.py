"""Losses and metrics as weighted sums, so any batch split gives the same result."""
