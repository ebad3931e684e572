"""Hugging Face conversion: one file per family (tensor names, config keys), and the folder I/O they share.

`bert` holds the tensor-spec machinery the other families build on; `folder` reads and writes an HF
folder (config.json, safetensors, tokenizer files); `exported` is what an export returns. Orbax
checkpoints of the train state are elsewhere (`bert_jax.checkpoint`).
"""
