"""Preparing corpora: tokenized documents written into ArrayRecord shards and a manifest (their format:
sources/prepared.py), locally or on Beam."""
