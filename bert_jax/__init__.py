"""bert_jax: pre-training BERT-family encoders with JAX and Flax linen.

The package root holds the console script (`cli`), the family registry (`families`), the generic registry helper
(`registry`) and `UserError`. Every command is a module of `commands/`; the library is the subpackages, bottom layer
first: `storage`; `models`, `objectives`, `parallel`; `checkpoint`, `hf`; `run`; `train`; `finetune`, `vocab`;
`plan` (docs/dev/architecture.md); `configs` and `launch` are the repository's configs/ and launch/, installed here.
Importing it changes nothing outside it: no environment variable, no JAX setting (a command chooses JAX's platform
where it starts, bert_jax/run/backend_choice.py).
"""


class UserError(ValueError):
    """A mistake in what the user asked for (a key, a flag, a path): a command prints its message, at most three
    lines naming the culprit, the value and what is accepted, and exits with status 2, before it creates anything.
    (A ValueError, so callers that catch those keep working.)"""


class StorageFault(RuntimeError):
    """The store failed under a running command (a full disk, a checkpoints folder or bucket that refuses writes):
    the command stops with its message, at most three lines naming the cause, and exit status 1. What was
    committed before it is intact, and the same command resumes once the cause is fixed."""


class MissingPathError(UserError, FileNotFoundError):
    """A path the user named (a corpus, a workdir, a folder) that does not exist or matches nothing. (A
    FileNotFoundError too, so callers that catch those keep working.)"""
