"""Fine-tuning: task heads on any registered family's encoder, trained by the pre-training machinery.

    python -m bert_jax.finetune --config=configs/finetune/classification.py --workdir=DIR

`run.py` is the loop, `model.py` the heads, `losses.py` their objectives, `data.py` the
files, `metrics.py` the scores, `init_from.py` where the encoder comes from, `hf_export.py`
the Hugging Face folder of the result.
"""
