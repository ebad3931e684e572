"""Orbax checkpoints of the train state together with the data iterator."""
