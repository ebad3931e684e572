"""The task registry, and where a task model's encoder parameters come from (bert_jax/finetune/tasks/,
run._pretrained). The readers and the SBERT losses: tests/test_finetune_readers.py, test_finetune_losses.py."""

import jax
import numpy as np
import pytest

import bert_jax.configs.finetune.classification
import finetune_data as fd
from bert_jax.finetune import init_from
from bert_jax.finetune.run import _pretrained
from bert_jax.finetune.tasks import get_task, known_tasks

torch = pytest.importorskip("torch")


def test_the_registry_holds_the_five_kinds_and_an_unknown_one_is_named():
    assert known_tasks() == ["classification", "regression", "sentence_embedding", "span_qa",
                             "token_classification"]
    with pytest.raises(ValueError, match=r"config.task.kind='ner' is unknown; known kinds: classification"):
        get_task("ner")


def test_the_backbone_comes_from_the_source_and_reinit_pooler_keeps_the_fresh_pooler(tmp_path):
    hf_dir = fd.write_tiny_hf_bert(str(tmp_path / "hf"))
    c = bert_jax.configs.finetune.classification.get_config()
    source = init_from.resolve(hf_dir, c.model)
    fresh = {"backbone": jax.tree.map(lambda a: np.full(a.shape, 7.0, a.dtype), source.params),
             "head": {"classifier": {"kernel": np.ones((2, 2), np.float32)}}}
    kept = _pretrained(fresh, source, c)
    jax.tree.map(np.testing.assert_array_equal, kept["backbone"], source.params)
    jax.tree.map(np.testing.assert_array_equal, kept["head"], fresh["head"])  # the head stays fresh
    c.train.reinit_pooler = True
    fresh_pooler = _pretrained(fresh, source, c)
    jax.tree.map(np.testing.assert_array_equal, fresh_pooler["backbone"]["pooler"], fresh["backbone"]["pooler"])
    jax.tree.map(np.testing.assert_array_equal, fresh_pooler["backbone"]["encoder"], source.params["encoder"])
