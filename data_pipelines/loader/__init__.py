"""Stages 4 and 5, examples -> masks -> batches: the checkpointable grain pipeline, its shuffles, and masking."""
