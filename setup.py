"""The installed packages: bert_jax and data_pipelines, with the repository's configs/ and launch/ installed inside
the library as bert_jax.configs and bert_jax.launch. Top-level packages named `configs` and `launch` would collide
with a user's own; the folders stay at the top of the repository, where the docs' `--config=configs/X.py` paths and
`python -m launch.ray_tpu` (from the repository root) find them. pyproject.toml's `packages.find` cannot install a
folder under another name, hence this file; everything else is in pyproject.toml.
"""
from setuptools import find_namespace_packages, setup

INSIDE_THE_LIBRARY = {"configs": "bert_jax.configs", "launch": "bert_jax.launch"}  # folder -> installed name


def packages() -> list[str]:
    found = find_namespace_packages(include=["bert_jax", "bert_jax.*", "data_pipelines", "data_pipelines.*"])
    for folder, name in INSIDE_THE_LIBRARY.items():
        found += [name + sub.removeprefix(folder) for sub in find_namespace_packages(include=[folder, f"{folder}.*"])]
    return found


setup(packages=packages(), package_dir={name: folder for folder, name in INSIDE_THE_LIBRARY.items()})
