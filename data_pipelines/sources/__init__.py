"""Stage 1, sources -> documents: files, TFDS or the embedded corpus read into raw documents, split into segments."""
