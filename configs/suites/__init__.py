"""Evaluation suites: batteries of fine-tuning tasks that `bert-jax evaluate` runs over seeds.

A suite file has `get_config()` returning a ConfigDict: `name`, `seeds` (how many per task),
`start_from_mnli` and `tasks`, one entry per task made by `bert_jax.configs.suites.recipe.task(...)`, and
optionally `retrieval` (`recipe.retrieval(...)`): zero-shot retrieval over --beir_dir's BEIR-layout datasets.
Each task entry holds where its files are, what its columns mean, its metric, its learning-rate grid and
`finetune`: the whole fine-tuning config of the task (configs/finetune/common.py) with the
suite's recipe, so any key can be changed for one task (`tasks.rte.finetune.train.epochs=10`).
"""
import importlib.util

import ml_collections

from bert_jax.configs.suites import embeddings, glue, retrieval, smoke

NAMED = {"glue": glue, "smoke": smoke, "retrieval": retrieval, "embeddings": embeddings}


def load_suite(name_or_path: str) -> ml_collections.ConfigDict:
    """A suite by name (configs/suites/<name>.py) or by path ("path/to/suite.py")."""
    if name_or_path in NAMED:
        return NAMED[name_or_path].get_config()
    spec = importlib.util.spec_from_file_location("suite_file", name_or_path)
    if not name_or_path.endswith(".py") or spec is None:
        raise ValueError(f"--suite={name_or_path!r}: neither a suite name ({', '.join(NAMED)}) nor a .py file")
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except FileNotFoundError:
        raise ValueError(f"--suite={name_or_path!r}: no such file") from None
    return module.get_config()
