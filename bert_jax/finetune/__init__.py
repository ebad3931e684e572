"""Fine-tuning: task heads on any registered family's encoder, run by the harness that runs pre-training.

    python -m bert_jax.finetune --config=configs/finetune/classification.py --workdir=DIR

`run.py` wires a run for bert_jax/run/harness.py; `tasks/` is the registry of task kinds (a
file each: rows, features, head, loss, metrics, predictions, export); `model.py` the encoder
under a head; `splits.py` and `data.py` the files, batches and packing; `metrics.py` the scores;
`init_from.py` where the encoder comes from; `hf_heads.py` and `hf_export.py` the Hugging Face
folder of the result; `cadence.py` and `diagnosis.py` when to validate and what the curves say.
"""
