"""Packed fine-tuning batches (bert_jax.finetune.data.pack_examples): every example's tokens land once, in its own
segment with positions from 0, and the encoder's states of each example, gathered back, equal its padded ones
for every family (absolute, offset, relative and rotary positions, with and without a pooler)."""
import jax
import ml_collections
import numpy as np
import pytest

from bert_jax.families import get_family
from bert_jax.finetune import data
from bert_jax.finetune.tasks import get_task
from conftest import small_model_config
from numerics import assert_close

LENGTH = 16


def padded_batch(seed: int, n: int = 8, vocab: int = 97, pairs: bool = False) -> dict:
    """Right-padded rows of 2..LENGTH real tokens, as featurize and pad_batch make them."""
    rng = np.random.default_rng(seed)
    out = {}
    for prefix in ("", "pair_") if pairs else ("",):
        lengths = rng.integers(2, LENGTH + 1, n)
        mask = (np.arange(LENGTH)[None] < lengths[:, None]).astype(np.int32)
        out[f"{prefix}input_ids"] = (rng.integers(5, vocab, (n, LENGTH)) * mask).astype(np.int32)
        out[f"{prefix}token_type_ids"] = ((np.arange(LENGTH)[None] >= lengths[:, None] // 2) * mask).astype(np.int32)
        out[f"{prefix}attention_mask"] = mask
    out["labels"], out["label_weights"] = np.zeros(n, np.int32), np.ones(n, np.float32)
    return out


@pytest.mark.parametrize("multiple", [1, 4])
def test_packing_places_every_token_once_in_its_own_segment(multiple):
    batch = padded_batch(0, n=32, pairs=True)
    packed = data.pack_examples(batch, multiple)
    for prefix in ("", "pair_"):
        ids, mask = batch[f"{prefix}input_ids"], batch[f"{prefix}attention_mask"]
        rows = packed[f"{prefix}packed_input_ids"]
        assert rows.shape[0] % multiple == 0 and rows.shape[1] == LENGTH
        assert rows.shape[0] * LENGTH < ids.size  # the point: fewer token slots than padded rows
        flat = {k: packed[f"{prefix}packed_{k}"].reshape(-1) for k in ("input_ids", "token_type_ids", "segment_ids",
                                                                        "position_ids", "attention_mask")}
        owner = np.zeros(rows.size, np.int64)
        for i, start in enumerate(packed[f"{prefix}example_starts"]):
            size = mask[i].sum()
            span = slice(start, start + size)
            np.testing.assert_array_equal(flat["input_ids"][span], ids[i, :size])
            np.testing.assert_array_equal(flat["token_type_ids"][span], batch[f"{prefix}token_type_ids"][i, :size])
            np.testing.assert_array_equal(flat["position_ids"][span], np.arange(size))
            assert (flat["segment_ids"][span] == i + 1).all() and start // LENGTH == (start + size - 1) // LENGTH
            owner[span] += 1
        assert (owner <= 1).all() and owner.sum() == mask.sum() == flat["attention_mask"].sum()
        np.testing.assert_array_equal(flat["attention_mask"], owner)


def test_batches_pack_into_at_least_the_rows_a_typical_full_batch_needs():
    features = padded_batch(2, n=256)
    rows = data.typical_rows(features, 32, 2)
    assert rows % 2 == 0 and rows == data.typical_rows(features, 32, 2)  # fixed by the data: a resume gets it too
    short = {k: v[:5] for k, v in features.items()}  # a run's last batch
    assert data.pack_examples(data.pad_batch(short, 32), 2, rows)["packed_input_ids"].shape[0] == rows
    full = data.pack_examples({k: v[:32] for k, v in features.items()}, 2, rows)
    assert full["packed_input_ids"].shape[0] >= rows


FAMILIES = {
    "bert": {},
    "roberta": dict(pad_token_id=1, max_position_embeddings=LENGTH + 2, type_vocab_size=1),
    "deberta_v3": dict(type_vocab_size=0, position_buckets=4, max_relative_positions=16, pad_token_id=0),
    "modernbert": dict(local_attention=4, global_attn_every_n_layers=2, pad_token_id=0),
}


@pytest.mark.parametrize("family", [f if f == "bert" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def test_packed_hidden_states_equal_padded_ones(family):
    cfg = small_model_config(family=family, dropout_rate=0.0, attention_dropout_rate=0.0, **FAMILIES[family])
    fam = get_family(family)
    has_pooler = family == "bert"
    task = ml_collections.ConfigDict({"kind": "classification", "pooling": "cls"})
    model = get_task(task.kind).build_model(fam, cfg, task, 2, has_pooler)
    batch = padded_batch(1)
    if family == "roberta":
        batch["token_type_ids"] = np.zeros_like(batch["token_type_ids"])
    params = model.init(jax.random.key(0), batch)["params"]
    packed = data.pack_examples(batch, 1)
    assert packed["packed_input_ids"].shape[0] < len(batch["input_ids"])
    encode = jax.jit(lambda b: model.apply({"params": params}, b, method=model.encode))
    padded_out, packed_out = encode(batch), encode(packed)
    real = batch["attention_mask"].astype(bool)
    assert_close(np.asarray(packed_out["hidden"])[real], np.asarray(padded_out["hidden"])[real], rtol=1e-5)
    if has_pooler:
        assert_close(packed_out["pooled"], padded_out["pooled"], rtol=1e-5)
