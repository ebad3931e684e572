"""Prepared corpora: tokenized documents in ArrayRecord shards and a manifest, written locally or on Beam."""
