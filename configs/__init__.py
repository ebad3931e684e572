"""ml_collections config files, one `get_config()` each; pass them by path to `--config`."""
