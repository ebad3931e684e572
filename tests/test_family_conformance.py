"""Every registered family keeps the contract the rest of the code relies on, with no table to edit: a family
added to bert_jax/families.py is tested here as it registers.

At micro sizes (one set for all, the family's defaults for the rest), each family: encodes, with a
pooled [CLS] exactly when it declares a pooler; gives every parameter a role (depth) it declares; encodes a
packed row as it encodes each example alone; exports to Hugging Face and imports back to the same params; and
has as many parameters as the transformers models of its exported config.json (both less the heads the converter
declares pre-training only, which the export leaves out); and `bert-jax inspect`'s views read it from its inputs alone
(tests/test_family_commands.py runs every command on a trained run of each family, with -m slow).
"""
import dataclasses

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

from bert_jax.families import get_family, known_families
from bert_jax.inspect import heads, views
from bert_jax.models.scan_layout import unstack_layers
from data_pipelines.tokenizers.tokenizer import load_tokenizer
from hf_parity import random_params

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LENGTH = 12
# hidden 48 / 3 heads: ELECTRA's default generator ratio (1/3) divides it; E = 16 != H exercises the
# factorised embeddings' projection (ALBERT, ELECTRA).
MICRO = dict(vocab_size=97, hidden_size=48, num_layers=2, num_heads=3, intermediate_size=96, embedding_size=16,
             max_position_embeddings=64, dropout_rate=0.0, attention_dropout_rate=0.0, scan_layers=True,
             remat_policy="none", dtype="float32", param_dtype="float32")
# Two documents of 5 and 7 tokens: padded, one per row; packed, one row.
LENGTHS = (5, 7)


def padded_batch() -> dict:
    rng = np.random.default_rng(0)
    mask = (np.arange(LENGTH)[None, :] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids = rng.integers(5, MICRO["vocab_size"], (len(LENGTHS), LENGTH)).astype(np.int32) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids),
            "masked_positions": np.array([[1, 2], [0, 3]], np.int32), "masked_ids": np.array([[7, 8], [9, 10]], np.int32),
            "masked_weights": np.ones((2, 2), np.float32),
            # each prediction's span: boundaries and offset (SpanBERT's SBO reads them; others ignore them)
            "masked_span_left": np.array([[0, 0], [-1, 2]], np.int32),
            "masked_span_right": np.array([[3, 3], [1, 4]], np.int32),
            "masked_span_offset": np.array([[0, 1], [0, 0]], np.int32)}


def packed_batch(padded: dict) -> dict:
    tokens = np.concatenate([padded["input_ids"][i, :n] for i, n in enumerate(LENGTHS)])
    segments = np.concatenate([np.full(n, i + 1) for i, n in enumerate(LENGTHS)])
    positions = np.concatenate([np.arange(n) for n in LENGTHS])
    row = lambda x: np.pad(x, (0, LENGTH - len(x)))[None].astype(np.int32)  # noqa: E731
    return {"input_ids": row(tokens), "attention_mask": row(np.ones_like(tokens)), "segment_ids": row(segments),
            "position_ids": row(positions), "token_type_ids": row(np.zeros_like(tokens))}


@pytest.fixture(scope="module", params=known_families())
def family_model(request):
    name = request.param
    family = get_family(name)
    # The module's own config dataclass holds every key the family reads (its defaults where MICRO is silent).
    built = family.build_model(ml_collections.ConfigDict(dict(MICRO, family=name))).config
    values = {f.name: getattr(built, f.name) for f in dataclasses.fields(built)}
    model_cfg = ml_collections.ConfigDict(dict(values, family=name, dtype="float32", param_dtype="float32"))
    model = family.build_model(model_cfg)
    params = random_params(model, padded_batch(), scale=0.05)
    return family, model_cfg, model, params


@pytest.fixture(scope="module")
def encode(family_model):
    """The family module's `encode` with its params, jitted: a compile per shape costs less than running eagerly."""
    _, _, model, params = family_model
    jitted = jax.jit(lambda p, batch: model.apply({"params": p}, batch, method=lambda m, b: m.encode(b)))
    return lambda batch: jitted(params, batch)


def test_a_family_encodes_and_pools_exactly_when_it_declares_a_pooler(family_model, encode):
    family, model_cfg, model, params = family_model
    encoded = encode(padded_batch())
    assert encoded["hidden"].shape == (len(LENGTHS), LENGTH, model_cfg.hidden_size)
    assert ("pooled" in encoded) == (family.roles.pooler is not None) == (family.roles.pooler in params)
    if family.roles.pooler is not None:
        assert encoded["pooled"].shape == (len(LENGTHS), model_cfg.hidden_size)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_every_parameter_has_a_declared_depth(family_model, scan_layers):
    family, model_cfg, _, _ = family_model
    model_cfg = ml_collections.ConfigDict(dict(model_cfg.to_dict(), scan_layers=scan_layers))
    shapes = nn.meta.unbox(jax.eval_shape(
        lambda: family.build_model(model_cfg).init(jax.random.key(0), padded_batch())["params"]))
    depths = set()
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        names = tuple(str(k.key) for k in path)
        depths.update(np.ravel(family.roles.depth(names, leaf.shape, model_cfg.num_layers, family.name)).tolist())
    top = model_cfg.num_layers + 1
    assert {0, top} <= depths <= set(range(top + 1))  # ALBERT's shared layer groups are declared at the top


def test_an_undeclared_parameter_fails_naming_it_and_the_family(family_model):
    family, model_cfg, _, _ = family_model
    with pytest.raises(ValueError, match=rf"{family.name}: parameter encoder/adapter/kernel plays no role"):
        family.roles.depth(("encoder", "adapter", "kernel"), (4, 4), model_cfg.num_layers, family.name)


def test_a_packed_row_encodes_as_each_example_alone(encode):
    padded = padded_batch()
    alone, packed = np.asarray(encode(padded)["hidden"]), np.asarray(encode(packed_batch(padded))["hidden"])[0]
    start = 0
    for i, n in enumerate(LENGTHS):
        np.testing.assert_allclose(packed[start:start + n], alone[i, :n], rtol=1e-4, atol=1e-5)
        start += n


def test_hf_export_imports_back_to_the_same_params(family_model):
    family, model_cfg, _, params = family_model
    exported = family.hf.to_hf(params, model_cfg)
    assert set(exported.subfolders) == set(family.hf.subfolders)
    zeros = jax.tree.map(np.zeros_like, params)
    extras = {"extras": exported.subfolders} if family.hf.subfolders else {}
    again, report = family.hf.from_hf(exported.state, exported.config, model_cfg, zeros, **extras)
    # A pre-training-only head (SpanBERT's SBO) is not exported: the import takes it from the fallback, and says so.
    dropped = family.hf.pretraining_only
    assert {name.split("/")[0] for name in report.kept_from_fallback} == set(dropped) and not report.unused
    for name in dropped:
        assert not any(np.any(leaf) for leaf in jax.tree.leaves(again.pop(name)))
    kept = {k: v for k, v in params.items() if k not in dropped}
    # GDES: the import recovers the delta as merged - shared, one float32 subtraction from the exported one.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6), again, kept)


def test_parameter_count_equals_the_transformers_models_of_the_export(family_model):
    """Each exported folder's config.json builds its transformers class (random init, on the meta device); a
    tensor two folders hold under one name with one value (ELECTRA's shared embeddings) is one of ours, and a
    tensor the class ignores (DeBERTa-v3's replaced-token head) is counted from the export."""
    family, model_cfg, _, params = family_model
    exported = family.hf.to_hf(params, model_cfg)
    folders = [(exported.state, exported.config), *exported.subfolders.values()]
    total, seen = 0, {}
    for state, hf_cfg in folders:
        values = {k: v for k, v in hf_cfg.items() if k not in ("architectures", "model_type")}
        config = transformers.AutoConfig.for_model(hf_cfg["model_type"], **values)
        with torch.device("meta"):
            hf_model = getattr(transformers, hf_cfg["architectures"][0])(config)
        total += sum(p.numel() for p in hf_model.parameters())
        # A bare base model (DebertaV2Model) loads names under its base_model_prefix too, as transformers does.
        held = set(hf_model.state_dict()) | {f"{hf_model.base_model_prefix}.{k}" for k in hf_model.state_dict()}
        total += sum(v.size for k, v in state.items() if k not in held)
        for name, value in state.items():
            if name in seen and np.array_equal(seen[name], value):
                total -= value.size
            seen[name] = value
    ours = sum(leaf.size for leaf in jax.tree.leaves({k: v for k, v in params.items()
                                                      if k not in family.hf.pretraining_only}))
    print(f"{family.name}: ours {ours:,} (less its pre-training-only heads) vs transformers {total:,}")
    assert ours == total


# A sentence of 8 tokens with [CLS] and [SEP]: the heads' batch of it (padded to 8) is the attention view's shape,
# so both share one compiled program.
INSPECT_TEXT = "the [MASK] of the list ."
INSPECT_VOCAB = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "of", "list", "module", "is", ",", ".")


@pytest.fixture(scope="module")
def inspect_tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inspect_vocab")
    (folder / "vocab.txt").write_text("\n".join(INSPECT_VOCAB) + "\n")
    return load_tokenizer(str(folder))


def test_inspect_reads_a_family_from_its_inputs_alone(family_model, inspect_tokenizer):
    """`bert-jax inspect`'s fill-mask, attention and heads run on ids and masks alone, as views.load builds them
    (unrolled layers, the reference kernel): no span boundaries (SpanBERT's SBO), no generator sample (a replaced-
    token detector), and fill-mask ranks what the pre-training forward's MLM logits give."""
    family, model_cfg, model, params = family_model
    unrolled = ml_collections.ConfigDict(dict(model_cfg.to_dict(), **views.RUNTIME, scan_layers=False))
    inspector = views.Inspector(family.build_model(unrolled), unstack_layers(params), inspect_tokenizer,
                                model_cfg.max_position_embeddings)
    ids, positions = views.encode(inspect_tokenizer, INSPECT_TEXT, inspector.max_length)
    assert len(ids) == 8 and len(positions) == 1
    [candidates] = views.fill_mask(inspector, INSPECT_TEXT, top_k=3)
    # The pre-training forward (scanned, every objective's key, a sample drawn) on the same ids.
    ones = np.ones((1, 1), np.int32)
    batch = {"input_ids": ids[None], "attention_mask": np.ones_like(ids)[None], "token_type_ids": 0 * ids[None],
             "masked_positions": positions * ones, "masked_ids": ones, "masked_weights": ones.astype(np.float32),
             "masked_span_left": 0 * ones, "masked_span_right": 2 * ones, "masked_span_offset": 0 * ones}
    forward = jax.jit(lambda p, b: model.apply({"params": p}, b, rngs={"sample": jax.random.key(0)})["mlm_logits"])
    logits = np.asarray(forward(params, batch), np.float64)[0, 0, :len(INSPECT_VOCAB)]  # jitted: faster than eager
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    best = np.argsort(-probs, kind="stable")[:3]
    assert [token for token, _ in candidates] == [INSPECT_VOCAB[i] for i in best]
    np.testing.assert_allclose([p for _, p in candidates], probs[best], rtol=1e-4)

    tokens, maps = views.attention_maps(inspector, INSPECT_TEXT)
    assert tokens[0] == "[CLS]" and maps.shape == (model_cfg.num_layers, model_cfg.num_heads, 8, 8)
    np.testing.assert_allclose(maps.sum(-1), 1.0, rtol=1e-5)
    stats, count = heads.measure(inspector, [ids])
    assert count == 1 and stats["cls"].shape == (model_cfg.num_layers, model_cfg.num_heads)
    np.testing.assert_allclose(stats["self"], np.trace(maps, axis1=-2, axis2=-1) / 8, rtol=1e-5)
