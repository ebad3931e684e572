"""Entry points log at INFO; orbax, grain and jax internals would drown that out."""
import logging as py_logging

from absl import logging

_NOISY = ("/orbax/", "/grain/", "/jax/_src/")


class _QuietLibraries(py_logging.Filter):
    """Drops the libraries' INFO chatter (per-save orbax lines and the like); their warnings still show."""

    def filter(self, record: py_logging.LogRecord) -> bool:
        return record.levelno >= py_logging.WARNING or not any(n in record.pathname for n in _NOISY)


def log_info_quietly() -> None:
    logging.set_verbosity(logging.INFO)
    logging.get_absl_handler().addFilter(_QuietLibraries())
