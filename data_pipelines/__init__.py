"""Data for BERT pre-training: sources -> documents -> token ids -> NSP pairs -> masks -> batches.

Each stage is a function of its inputs (plus an explicit seed), so a later stage can be
swapped (e.g. a streaming ArrayRecord source) without touching the others.
"""
