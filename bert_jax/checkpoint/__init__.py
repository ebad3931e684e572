"""Orbax checkpoints of the train state together with the data iterator."""
from bert_jax.checkpoint import s3_store

s3_store.install()  # s3:// checkpoints, for every orbax user in the process (see s3_store.py)
