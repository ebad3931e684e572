"""Stage 3, token ids -> examples: sentence pairs (NSP/SOP) or packed rows, one document at a time."""
