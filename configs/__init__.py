"""ml_collections config files, one `get_config()` each; pass them by path to `--config` (`--config=configs/tiny.py`).

Installed as `bert_jax.configs` (a top-level `configs` would collide with a user's own package): a config file
builds on another with `from bert_jax.configs import base`, wherever it lives.
"""
