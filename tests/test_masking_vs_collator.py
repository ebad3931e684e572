"""bert_jax's masking against transformers' DataCollatorForLanguageModeling, statistic by statistic.

The micro tests (default suite) pin what a user's loss depends on without torch: every corrupted position has a
loss and every loss position was selected, replacements stay among the tokenizer's ids, the per-token loss
weighting, the keys that choose the collator's behaviour. The slow tests mask the same real rows (the
FULL-SENTENCES rows of the embedded corpus, with a WordPiece vocabulary the project trains) both ways and compare
the share selected, its spread over rows, the 80/10/10 split, which tokens can be selected, and the random
replacements' distribution. docs/guides/parity.md says what differs and which key chooses.
"""

import numpy as np
import pytest

from data_pipelines.loader import masking
from data_pipelines.tokenizers.tokenizer import SpecialIds

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


def _rows(rng, rows=16, length=32, vocab=50):
    ids = rng.integers(5, vocab, size=(rows, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = SPECIALS.cls, SPECIALS.sep
    ids[::2, length // 2:] = SPECIALS.pad
    return ids


def _masker(mode="token", predictions=32, vocab=50, word_starts=None, tokenizer_size=None, **keys):
    spec = masking.MaskingSpec(mode, 0.15, predictions, vocab, max_seq_length=32, **keys)
    return masking.Masker(spec, SPECIALS, word_starts, tokenizer_size=tokenizer_size)


def _selected(out, shape):
    selected = np.zeros(shape, bool)
    rows, slots = np.nonzero(out["masked_weights"])
    selected[rows, out["masked_positions"][rows, slots]] = True
    return selected


@pytest.mark.parametrize("keys", [dict(mode="token", predictions=5), dict(mode="whole_word", predictions=5),
                                  dict(mode="token", mask_count="bernoulli"),
                                  dict(mode="whole_word", mask_count="bernoulli")])
def test_every_corrupted_position_has_a_loss_and_every_loss_position_was_selected(keys):
    """A cap that dropped a selection but still corrupted its input (or the reverse) would train on a masked
    input without a loss: the corrupted positions must lie inside the weighted ones, one weight per selection."""
    rng = np.random.default_rng(0)
    ids = _rows(rng)
    starts = np.arange(60) % 3 != 1  # some tokens continue a word
    out = _masker(word_starts=starts, random_token_share=0.0, mask_token_share=1.0, **keys)(ids, rng)
    selected = _selected(out, ids.shape)
    assert np.array_equal(out["input_ids"] != ids, selected)  # all [MASK]: changed exactly where selected
    assert out["masked_weights"].sum() == selected.sum()
    assert not selected[np.isin(ids, SPECIALS.all())].any()


def test_a_bernoulli_gather_narrower_than_the_row_is_refused_rather_than_dropping_selections():
    spec = masking.MaskingSpec("token", 0.15, 20, 50, mask_count="bernoulli", max_seq_length=32)
    with pytest.raises(ValueError, match="max_predictions_per_seq=20"):
        spec.validate()
    loose = masking.Masker(masking.MaskingSpec("token", 0.15, 20, 50, mask_count="bernoulli"), SPECIALS)
    with pytest.raises(ValueError, match="mask_count='bernoulli'"):
        loose(_rows(np.random.default_rng(0)), np.random.default_rng(0))


def test_auto_gather_is_the_whole_row_under_bernoulli_and_the_budget_otherwise():
    import ml_collections

    data = ml_collections.ConfigDict(dict(max_predictions_per_seq="auto", mask_rate=0.15, max_seq_length=128,
                                          mask_count="exact"))
    assert masking.max_predictions(data) == 20
    data.mask_count = "bernoulli"
    assert masking.max_predictions(data) == 128


@pytest.mark.parametrize("random_tokens, specials_drawn", [("ordinary", False), ("any", True)])
def test_random_replacements_stay_among_the_tokenizers_ids(random_tokens, specials_drawn):
    """A model vocabulary wider than the tokenizer's (vocab 50, tokenizer 12) holds rows no text uses: a random
    replacement is drawn below the tokenizer's size, as the collator's randint(len(tokenizer))."""
    rng = np.random.default_rng(1)
    ids = _rows(rng, rows=64, vocab=12)
    out = _masker(tokenizer_size=12, random_tokens=random_tokens, mask_token_share=0.0,
                  random_token_share=1.0)(ids, rng)
    drawn = out["input_ids"][_selected(out, ids.shape)]
    assert drawn.max() < 12
    assert np.isin(drawn, SPECIALS.all()).any() == specials_drawn


@pytest.mark.parametrize("keys, match", [
    (dict(mask_token_share=0.9, random_token_share=0.2), "mask_token_share=0.9"),
    (dict(random_tokens="all"), "random_tokens='all'"),
    (dict(mask_count="binomial"), "mask_count='binomial'"),
])
def test_bad_masking_keys_name_the_key(keys, match):
    with pytest.raises(ValueError, match=match):
        masking.MaskingSpec("token", 0.15, 20, 50, **keys).validate()


def test_mlm_loss_is_a_mean_over_the_batchs_masked_tokens_not_over_sequences():
    """The collator's labels with -100 give PyTorch's mean over every masked token of the batch; bert_jax's
    sums over weighted predictions divided by the weights' sum are that mean: a row with more masked tokens
    weighs more, as in transformers."""
    from bert_jax.objectives import mlm

    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 4, 7)).astype(np.float32)
    ids = rng.integers(0, 7, size=(2, 4))
    weights = np.array([[1, 1, 1, 1], [1, 0, 0, 0]], np.float32)  # 4 masked tokens in one row, 1 in the other
    loss = float(mlm.mlm_sums(logits, ids, weights)["mlm_loss"] / mlm.mlm_weights(weights)["mlm_loss"])
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    per_token = -np.take_along_axis(log_probs, ids[..., None], -1)[..., 0]
    assert loss == pytest.approx(per_token[weights > 0].mean(), rel=1e-5)
    per_sequence = np.mean([per_token[r][weights[r] > 0].mean() for r in range(2)])
    assert abs(loss - per_sequence) > 1e-3  # the two weightings differ on these rows


# ------------------------------------------------------------------------------------------------------------
# Slow: the same real rows, masked by bert_jax and by the collator.
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(data config, the project's tokenizer, transformers' view of it, [N, 128] unmasked FULL-SENTENCES rows)."""
    transformers = pytest.importorskip("transformers")
    from bert_jax.configs import base
    from data_pipelines.loader import pipeline
    from data_pipelines.tokenizers import tokenizer as tokenizer_lib

    config = base.get_config()
    config.model.vocab_size = 2048
    data = config.data.copy_and_resolve_references()
    data.example_builder, data.max_seq_length, data.prefetch_buffer_size = "full_sentences", 128, 0
    data.tokenizer.sample_bytes = 300_000
    directory = str(tmp_path_factory.mktemp("tokenizer"))
    tokenizer = tokenizer_lib.prepare_tokenizer(data, directory)
    iterator = pipeline.build_train_iterator(data, tokenizer, seed=0, per_host_batch_size=32)
    rows = []
    for _ in range(40):
        batch = next(iterator)
        ids = batch["input_ids"].copy()
        r, s = np.nonzero(batch["masked_weights"])
        ids[r, batch["masked_positions"][r, s]] = batch["masked_ids"][r, s]
        rows.append(ids)
    return data, tokenizer, transformers.AutoTokenizer.from_pretrained(directory), np.concatenate(rows)


def _bert_jax(corpus, **keys):
    """(selected [N, L] bool, corrupted input_ids) from the project's masker with `keys` set in config.data."""
    from data_pipelines.loader import pipeline

    data, tokenizer, _, rows = corpus
    data = data.copy_and_resolve_references()
    for key, value in keys.items():
        data[key] = value
    masker = pipeline.make_mask_batch(data, tokenizer)
    rng = np.random.default_rng(7)
    selected, inputs = [], []
    for start in range(0, len(rows), 32):
        out = masker.random_map({"input_ids": rows[start:start + 32],
                                 "token_type_ids": np.zeros_like(rows[start:start + 32])}, rng)
        selected.append(_selected(out, out["input_ids"].shape))
        inputs.append(out["input_ids"])
    return np.concatenate(selected), np.concatenate(inputs)


def _collator(corpus, whole_word=False):
    """(selected, corrupted input_ids) from DataCollatorForLanguageModeling on the same rows; for whole words,
    offsets that put a gap before each of the tokenizer's word starts, so both sides mean the same words."""
    import transformers

    data, tokenizer, hf_tokenizer, rows = corpus
    collator = transformers.DataCollatorForLanguageModeling(hf_tokenizer, mlm_probability=data.mask_rate, seed=7,
                                                            whole_word_mask=whole_word)
    starts = tokenizer.word_start_flags()
    selected, inputs = [], []
    for start in range(0, len(rows), 32):
        part = rows[start:start + 32]
        examples = [{"input_ids": row.tolist()} for row in part]
        if whole_word:
            for example, row in zip(examples, part):
                gap = np.cumsum(starts[row] | np.isin(row, special_ids(tokenizer)))
                begin = np.arange(len(row)) + gap
                example["offset_mapping"] = np.stack([begin, begin + 1], -1).tolist()
        batch = collator(examples)
        selected.append((batch["labels"] != -100).numpy())
        inputs.append(batch["input_ids"].numpy())
    return np.concatenate(selected), np.concatenate(inputs)


def special_ids(tokenizer) -> tuple[int, ...]:
    from data_pipelines.tokenizers import tokenizer as tokenizer_lib

    return tokenizer_lib.special_ids(tokenizer).all()


def _maskable(corpus):
    _, tokenizer, _, rows = corpus
    return ~np.isin(rows, special_ids(tokenizer))


@pytest.mark.slow
def test_share_selected_and_its_spread_over_rows_match_the_collator(corpus):
    maskable = _maskable(corpus)
    share = {}
    for name, selected in [("exact", _bert_jax(corpus)[0]), ("bernoulli", _bert_jax(corpus, mask_count="bernoulli")[0]),
                           ("collator", _collator(corpus)[0])]:
        assert not (selected & ~maskable).any(), f"{name} selected a special token or padding"
        per_row = selected.sum(1) / maskable.sum(1)
        share[name] = (selected.sum() / maskable.sum(), per_row.std())
    for name in ("exact", "bernoulli"):
        assert share[name][0] == pytest.approx(share["collator"][0], abs=0.004)
    # An exact budget per row (BERT's) has almost no spread; bernoulli has the collator's.
    assert share["exact"][1] < 0.2 * share["collator"][1]
    assert share["bernoulli"][1] == pytest.approx(share["collator"][1], rel=0.15)


def _split(rows, selected, inputs, mask_id):
    original, now = rows[selected], inputs[selected]
    masked = now == mask_id
    kept = (now == original) & ~masked
    return masked.mean(), (~masked & ~kept).mean(), kept.mean(), now[~masked & ~kept]


@pytest.mark.slow
def test_80_10_10_split_and_random_replacements_match_the_collator(corpus):
    _, tokenizer, _, rows = corpus
    special = special_ids(tokenizer)
    mask_id = tokenizer.token_to_id("[MASK]")
    ours = _split(rows, *_bert_jax(corpus), mask_id)
    theirs = _split(rows, *_collator(corpus), mask_id)
    for a, b, expected in zip(ours[:3], theirs[:3], (0.8, 0.1, 0.1)):
        assert a == pytest.approx(expected, abs=0.01) and b == pytest.approx(expected, abs=0.01)
    size = tokenizer.get_vocab_size()
    for drawn in (ours[3], theirs[3]):
        assert drawn.max() < size
        counts = np.bincount(drawn // (size // 8), minlength=8)  # uniform over eighths of the vocabulary
        assert counts.min() > 0.75 * counts.mean()
    assert not np.isin(ours[3], special).any()  # random_tokens=ordinary: never a special
    # The collator draws specials too, at about their share of the vocabulary; random_tokens=any does the same.
    anyway = _split(rows, *_bert_jax(corpus, random_tokens="any", mask_token_share=0.0, random_token_share=1.0),
                    mask_id)[3]
    rate = len(special) / size
    assert np.isin(anyway, special).mean() == pytest.approx(rate, abs=4 * np.sqrt(rate / len(anyway)))


@pytest.mark.slow
def test_whole_word_masking_matches_the_collators_whole_word_mode(corpus):
    """On the same words, both mask whole words at the same token share; the collator's whole-word mode makes
    every selected token [MASK], which bert_jax does with mask_token_share=1, random_token_share=0."""
    _, tokenizer, _, rows = corpus
    mask_id = tokenizer.token_to_id("[MASK]")
    maskable = _maskable(corpus)
    ours, ours_inputs = _bert_jax(corpus, masking="whole_word", mask_token_share=1.0, random_token_share=0.0)
    theirs, theirs_inputs = _collator(corpus, whole_word=True)
    for selected, inputs in ((ours, ours_inputs), (theirs, theirs_inputs)):
        assert not (selected & ~maskable).any()
        assert (inputs[selected] == mask_id).all()
        assert selected.sum() / maskable.sum() == pytest.approx(0.15, abs=0.01)
    # Whole words on both sides: a selected word's continuation pieces are selected with it.
    starts = tokenizer.word_start_flags()
    for selected in (ours, theirs):
        continuation = ~starts[rows] & maskable
        continuation[:, 0] = False
        continuation[:, 1:] &= maskable[:, :-1]  # a piece right after a special starts a word on both sides
        assert np.array_equal(selected[:, 1:][continuation[:, 1:]], selected[:, :-1][continuation[:, 1:]])
