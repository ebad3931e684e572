"""Fine-tuning configs, one per task kind; pass them by path to `bert-jax finetune --config`."""
