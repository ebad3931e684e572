"""Fine-tuning configs, one per task kind; pass them by path to `python -m bert_jax.finetune --config`."""
