"""Every entry point, one module per command: `bert-jax <name>` runs `<name>.py` here (`_` read as `-`).

A command parses its flags, checks its whole input before it creates anything, and hands the work to the library
below; the first line of its docstring is its line in `bert-jax --help` (bert_jax/cli.py reads this folder).
"""
