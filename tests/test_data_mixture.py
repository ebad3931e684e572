"""Data mixtures (data.mixture): realised fractions, exact resume, schedules, per-source counts and eval,
and the config errors, on micro corpora without training (one slow test trains)."""

import json
import logging
import re

import numpy as np
import pytest

from bert_jax import UserError
from bert_jax.configs import base
from bert_jax.run import mixture_overrides
from data_pipelines.loader import mixing, pipeline
from data_pipelines.shards import prepare as prepare_lib
from data_pipelines.sources import corpus, mixture
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

BATCH = 8


def _write_corpora(root, documents):
    """Three micro corpora of different documents: text files, a JSONL file, and text to prepare."""
    text_dir, jsonl_path, raw_dir = root / "books", root / "web.jsonl", root / "raw"
    text_dir.mkdir()
    raw_dir.mkdir()
    for f in range(2):
        (text_dir / f"part{f}.txt").write_text("\n\n".join("\n".join(d) for d in documents[f:120:2]))
    with open(jsonl_path, "w") as out:
        for document in documents[120:240]:
            out.write(json.dumps({"text": "\n".join(document)}) + "\n")
    (raw_dir / "wiki.txt").write_text("\n\n".join("\n".join(d) for d in documents[240:360]))
    return text_dir, jsonl_path, raw_dir


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """(data config with a 70/20/10 mixture of text, jsonl and prepared shards, its tokenizer)."""
    root = tmp_path_factory.mktemp("mixture")
    text_dir, jsonl_path, raw_dir = _write_corpora(root, list(corpus.embedded_documents()))
    cfg = base.get_config().data
    cfg.vocab_size = 1024
    cfg.max_seq_length = 64
    cfg.max_predictions_per_seq = 10
    cfg.shuffle_window = 16
    cfg.num_eval_batches = 1
    cfg.eval_fraction = 0.1
    cfg.tokenizer.sample_bytes = 200_000
    cfg.mixture = dict(books=dict(source="text", path=str(text_dir / "*.txt"), weight=0.7),
                       web=dict(source="jsonl", path=str(jsonl_path), weight=0.2))
    tokenizer_dir = str(root / "tokenizer")
    tokenizer = tokenizer_lib.prepare_tokenizer(cfg, tokenizer_dir)
    raw = cfg.copy_and_resolve_references()
    raw.mixture, raw.source, raw.path = {}, "text", str(raw_dir)
    raw.tokenizer.path = tokenizer_dir
    prepare_lib.prepare(raw, str(root / "wiki"), docs_per_shard=20, num_parts=1)
    cfg.mixture.wiki = dict(source="prepared", path=str(root / "wiki"), weight=0.1)
    return cfg, tokenizer


def _iterator(cfg, tokenizer, **kwargs):
    return pipeline.build_train_iterator(cfg, tokenizer, seed=3, per_host_batch_size=BATCH, **kwargs)


def _same(batches_a, batches_b):
    return len(batches_a) == len(batches_b) and all(
        a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(batches_a, batches_b))


@pytest.mark.parametrize("sequences", [2_000, pytest.param(10_000, marks=pytest.mark.slow)])
def test_a_mixture_realises_its_weights(corpora, sequences):
    cfg, tokenizer = corpora
    iterator = _iterator(cfg, tokenizer)
    for _ in range(sequences // BATCH):
        batch = next(iterator)
    assert mixing.SOURCE_IDS not in batch and set(batch) == set(pipeline.batch_spec(cfg, BATCH))
    row = mixing.count_metrics(iterator.names, iterator.sequences, iterator.tokens)
    assert sum(row[f"data/{n}/sequences"] for n in iterator.names) == sequences
    for name, weight in zip(mixture.source_names(cfg), (0.7, 0.2, 0.1)):
        assert abs(row[f"data/{name}/fraction"] - weight) < 0.01, (name, row)
        assert row[f"data/{name}/tokens"] > 0
    assert row["data/books/tokens"] > row["data/web/tokens"] > row["data/wiki/tokens"]


def test_a_mixture_resumes_with_identical_batches_and_counts(corpora):
    cfg, tokenizer = corpora
    iterator = _iterator(cfg, tokenizer)
    for _ in range(7):
        next(iterator)
    state = json.loads(json.dumps(iterator.get_state()))  # as the checkpoint stores it
    straight = [next(iterator) for _ in range(12)]
    resumed = _iterator(cfg, tokenizer)
    resumed.set_state(state)
    assert _same(straight, [next(resumed) for _ in range(12)])
    np.testing.assert_array_equal(resumed.sequences, iterator.sequences)
    np.testing.assert_array_equal(resumed.tokens, iterator.tokens)


def test_a_schedule_switches_the_mixture_at_its_step(corpora):
    cfg, tokenizer = corpora
    cfg = cfg.copy_and_resolve_references()
    cfg.mixture.books.weight, cfg.mixture.web.weight, cfg.mixture.wiki.weight = 0.9, 0.1, 0.0
    cfg.mixture_schedule = ((40, dict(books=0.1, web=0.9)),)
    iterator = _iterator(cfg, tokenizer)
    books_per_interval = []
    for _ in range(4):  # logging intervals of 20 steps
        before = iterator.sequences.copy()
        for _ in range(20):
            next(iterator)
        books_per_interval.append((iterator.sequences - before) / (20 * BATCH))
    # The shuffle window (16 examples) blurs the switch over at most two batches of the interval.
    assert [round(f[0], 1) for f in books_per_interval] == [0.9, 0.9, 0.1, 0.1], books_per_interval
    assert iterator.sequences[2] == 0  # wiki at weight 0 is never drawn
    state = iterator.get_state()
    straight = [next(iterator) for _ in range(5)]
    resumed = _iterator(cfg, tokenizer)
    resumed.set_state(state)
    assert _same(straight, [next(resumed) for _ in range(5)])


def test_an_iterator_starting_later_takes_the_schedule_at_its_first_step(corpora):
    """A staged run's stage starts a fresh iterator at its start step: the schedule counts the run's steps."""
    cfg, tokenizer = corpora
    cfg = cfg.copy_and_resolve_references()
    cfg.mixture.books.weight, cfg.mixture.web.weight, cfg.mixture.wiki.weight = 0.9, 0.1, 0.0
    cfg.mixture_schedule = ((40, dict(books=0.1, web=0.9)),)
    iterator = _iterator(cfg, tokenizer, first_step=40)
    for _ in range(10):
        next(iterator)
    assert iterator.sequences.tolist() == [8, 72, 0]


@pytest.mark.slow  # worker start-up costs seconds on 2 cores
def test_grain_worker_processes_give_a_mixture_its_weights(corpora):
    cfg, tokenizer = corpora
    cfg = cfg.copy_and_resolve_references()
    with cfg.ignore_type():  # worker_count's default is "auto": a copy holds it as a str field
        cfg.worker_count = 2
    iterator = _iterator(cfg, tokenizer)
    for _ in range(100):
        next(iterator)
    fractions = iterator.sequences / iterator.sequences.sum()
    np.testing.assert_allclose(fractions, [0.7, 0.2, 0.1], atol=0.01)


def _until_the_end(iterator):
    batches = []
    for batch in iterator:
        batches.append(batch)
    return batches


def test_a_source_that_stops_ends_the_data_at_its_last_full_batch_and_resumes_so(corpora):
    """wiki (prepared) stops, books and web repeat: the data ends before wiki's second epoch, its epochs
    and the others' are counted, the end holds, and a resume ends at the same batch."""
    cfg, tokenizer = corpora
    cfg = cfg.copy_and_resolve_references()
    cfg.mixture.wiki.weight, cfg.mixture.wiki.on_exhausted = 0.6, "stop"
    cfg.mixture.wiki.eval_fraction = cfg.mixture.books.eval_fraction = 0.9  # a tenth of each trains: short epochs
    iterator = _iterator(cfg, tokenizer)
    for _ in range(5):
        next(iterator)
    state = json.loads(json.dumps(iterator.get_state()))
    rest = _until_the_end(iterator)
    assert iterator.ended == "wiki"
    assert iterator.epochs.tolist()[2] == 0 and iterator.epochs.tolist()[0] >= 1  # books repeated, wiki did not
    with pytest.raises(StopIteration):
        next(iterator)  # ended for good
    row = mixing.count_metrics(iterator.names, iterator.sequences, iterator.tokens, iterator.epochs)
    assert row["data/wiki/epochs"] == 0 and row["data/books/epochs"] == iterator.epochs[0]
    resumed = _iterator(cfg, tokenizer)
    resumed.set_state(state)
    assert _same(rest, _until_the_end(resumed)) and resumed.ended == "wiki"
    ended = _iterator(cfg, tokenizer)
    ended.set_state(json.loads(json.dumps(iterator.get_state())))
    with pytest.raises(StopIteration):
        next(ended)  # the end is in the checkpointed state


def test_each_source_has_its_own_eval_batches(corpora):
    cfg, tokenizer = corpora
    sets = pipeline.build_eval_sets(cfg, tokenizer, seed=0, per_host_batch_size=BATCH)
    assert [name for name, _ in sets] == ["books", "web", "wiki"]
    assert all(len(batches) == 1 for _, batches in sets)
    assert not any(np.array_equal(sets[0][1][0]["input_ids"], other[0]["input_ids"]) for _, other in sets[1:])
    single = cfg.copy_and_resolve_references()
    single.mixture = {}
    assert [name for name, _ in pipeline.build_eval_sets(single, tokenizer, seed=0, per_host_batch_size=BATCH)] == [""]


def test_the_tokenizer_of_a_mixture_with_prepared_sources_is_theirs(corpora, tmp_path):
    cfg, tokenizer = corpora
    run_tokenizer = tokenizer_lib.prepare_tokenizer(cfg, str(tmp_path / "run"))
    assert run_tokenizer.get_vocab_size() == tokenizer.get_vocab_size()
    assert all(run_tokenizer.id_to_token(i) == tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size()))
    other = cfg.copy_and_resolve_references()
    other.mixture, other.vocab_size = {}, 700
    tokenizer_lib.prepare_tokenizer(other, str(tmp_path / "other"))  # a workdir that holds another tokenizer
    with pytest.raises(ValueError, match=r"config.data.mixture.wiki.path=.*another tokenizer"):
        tokenizer_lib.prepare_tokenizer(cfg, str(tmp_path / "other"))


def test_prepare_refuses_a_mixture_naming_what_to_do(corpora, tmp_path):
    with pytest.raises(ValueError, match="config.data.mixture is set: prepare each of its sources on its own"):
        prepare_lib.prepare(corpora[0], str(tmp_path / "out"))


def _temperature_config(corpora, root):
    """The corpora's prepared wiki (120 documents: its manifest) beside a text source of 12 documents and a JSONL
    source of 240 (both counted), weighted by temperature; the full pre-training config."""
    cfg, _ = corpora
    documents = list(corpus.embedded_documents())
    (root / "small.txt").write_text("\n\n".join("\n".join(d) for d in documents[:12]))
    with open(root / "large.jsonl", "w") as out:
        for document in documents[120:360]:
            out.write(json.dumps({"text": "\n".join(document)}) + "\n")
    config = base.get_config()
    config.data = cfg.copy_and_resolve_references()
    config.data.mixture = dict(small=dict(source="text", path=str(root / "small.txt")),
                               large=dict(source="jsonl", path=str(root / "large.jsonl")),
                               wiki=dict(cfg.mixture.wiki, weight=None))
    del config.data.mixture.wiki["weight"]
    config.data.mixture_alpha = 0.3
    return config


def test_temperature_sampling_realises_shares_proportional_to_size_to_the_alpha(corpora, tmp_path, caplog):
    """XLM-R's alpha = 0.3 over sources of 12, 120 and 240 documents: each source's realised share of the
    sequences is n ** 0.3 / sum(n ** 0.3) within 1 % (relative); the sizes and weights are logged and recorded."""
    from bert_jax.train.config_validation import resolve_config

    config = _temperature_config(corpora, tmp_path)
    with caplog.at_level(logging.INFO):
        resolved = resolve_config(config)
    sizes = {name: resolved.data.mixture[name].size for name in mixture.source_names(resolved.data)}
    assert sizes == {"large": 240, "small": 12, "wiki": 120}  # counted, counted, the manifest's
    assert "config.data.mixture.wiki.size -> 120 documents (its manifest)" in caplog.text
    assert "config.data.mixture.small.size -> 12 documents (a counting pass over 1 file)" in caplog.text
    expected = np.array([240, 12, 120], float) ** 0.3
    expected /= expected.sum()
    assert "config.data.mixture_alpha=0.3 -> weights large 0.4506, small 0.1834, wiki 0.3660" in caplog.text
    assert json.loads(resolved.to_json_best_effort())["data"]["mixture"]["small"]["size"] == 12  # recorded
    iterator = _iterator(resolved.data, corpora[1])
    for _ in range(1_600 // BATCH):
        next(iterator)
    realised = iterator.sequences / iterator.sequences.sum()
    np.testing.assert_allclose(realised, expected, rtol=0.01)
    print(f"realised {np.round(realised, 4).tolist()} for n ** 0.3 shares {np.round(expected, 4).tolist()}")


def test_temperature_alpha_changes_by_stage_and_refuses_a_weight_beside_it(corpora, tmp_path):
    """mmBERT's alpha lowered across phases: each mixture_alpha_schedule entry is a stage of its own weights."""
    config = _temperature_config(corpora, tmp_path)
    config.data.mixture_alpha, config.data.mixture_alpha_schedule = 1.0, ((40, 0.0),)
    for name, size in (("large", 240), ("small", 12), ("wiki", 120)):
        config.data.mixture[name].size = size  # given: no counting pass
    assert mixture.resolve_sizes(config.data) == [
        "config.data.mixture.large.size -> 240 documents (set)", "config.data.mixture.small.size -> 12 documents (set)",
        "config.data.mixture.wiki.size -> 120 documents (set)",
        "config.data.mixture_alpha=1 -> weights large 0.6452, small 0.0323, wiki 0.3226 (p ~ size ** alpha)",
        "config.data.mixture_alpha=0 from step 40 -> weights large 0.3333, small 0.3333, wiki 0.3333 (p ~ size ** "
        "alpha)"]
    assert mixture.stages(config.data)[1] == (40, (1 / 3, 1 / 3, 1 / 3))
    resumed = config.data.copy_and_resolve_references()
    del resumed.mixture.small["size"]  # a resume reads the size its run recorded, and counts nothing
    assert mixture.resolve_sizes(resumed, {"mixture": {"small": {"size": 12}}})[1] == \
        "config.data.mixture.small.size -> 12 documents (as the run recorded it)"
    for change, message in [
            (lambda d: d.mixture.small.update(weight=0.5), r"config.data.mixture.small.weight=0.5 and "
                                                           r"config.data.mixture_alpha=1.0 are both set"),
            (lambda d: setattr(d, "mixture_schedule", ((10, dict(small=1.0)),)),
             r"config.data.mixture_schedule and config.data.mixture_alpha are both set"),
            (lambda d: setattr(d, "mixture_alpha_schedule", ((40, 0.5), (20, 0.3))),
             r"config.data.mixture_alpha_schedule\[1\]: step 20 must be an integer above"),
            (lambda d: setattr(d, "mixture_alpha", -0.3), r"config.data.mixture_alpha=-0.3 must be >= 0"),
            (lambda d: d.mixture.small.update(size=0), r"config.data.mixture.small.size=0 must be a whole number"),
            (lambda d: setattr(d, "mixture_alpha", None), r"mixture_alpha_schedule is set but .*mixture_alpha is not")]:
        data = config.data.copy_and_resolve_references()
        change(data)
        with pytest.raises(ValueError, match=message):
            mixture.check_mixture(data)


@pytest.mark.parametrize("change, message", [
    (lambda c: c.mixture.web.update(weight=-1), r"config.data.mixture.web.weight=-1(\.0)? must be >= 0"),
    (lambda c: [c.mixture[n].update(weight=0) for n in c.mixture], r"every source's weight is 0"),
    (lambda c: c.mixture.web.update(path="/no/such/*.jsonl"), r"config.data.mixture.web.path=.*matches no files"),
    (lambda c: c.mixture.web.update(source="csv"), r"config.data.mixture.web.source='csv' is unknown; known sources:"),
    (lambda c: setattr(c, "mixture_schedule", ((10, dict(news=1.0)),)),
     r"config.data.mixture_schedule\[0\] names \['news'\]"),
    (lambda c: setattr(c, "mixture_schedule", ((10, dict(web=1.0)), (5, dict(books=1.0)))),
     r"config.data.mixture_schedule\[1\]: step 5 must be an integer above the stage before's \(10\)"),
    (lambda c: c.mixture.web.update(max_seq_length=32), r"config.data.mixture.web sets \['max_seq_length'\]"),
    (lambda c: c.mixture.web.update(on_exhausted="end"),
     r"config.data.mixture.web.on_exhausted='end' is not one of \('repeat', 'stop'\)"),
])
def test_a_bad_mixture_fails_naming_the_key(corpora, change, message):
    cfg = corpora[0].copy_and_resolve_references()
    change(cfg)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        mixture.check_mixture(cfg)


def test_overrides_alone_add_a_source_and_set_any_documented_key_of_the_files_sources():
    """`--config.data.mixture.<name>.<key>=value` (bert_jax/run/mixture_overrides.py), as every command parses it."""
    config = base.get_config()
    config.data.mixture = dict(web=dict(source="jsonl", path="web/*.jsonl", weight=7))
    config.lock()
    argv, overrides = mixture_overrides.take([
        "bert-jax", "--config.data.mixture.web.on_exhausted=stop", "--config.data.mixture.web.weight", "0.5",
        "--config.data.mixture.books.source=text", "--config.data.mixture.books.max_line_bytes=100",
        "--config.data.mask_rate=0.3", "--", "--config.data.mixture.x.weight=1"])
    assert argv == ["bert-jax", "--config.data.mask_rate=0.3", "--", "--config.data.mixture.x.weight=1"]
    mixture_overrides.apply(config, overrides)
    assert config.data.mixture.to_dict() == {
        "web": {"source": "jsonl", "path": "web/*.jsonl", "weight": 0.5, "on_exhausted": "stop"},
        "books": {"source": "text", "max_line_bytes": 100}}
    for flag, says in [("--config.data.mixture.web.fraction=0.5", "has no key 'fraction'; its keys: weight, "
                                                                 "on_exhausted, size, source, path, field"),
                       ("--config.data.mixture.web.weight=half", "weight takes a number (float), not 'half'")]:
        with pytest.raises(UserError, match=re.escape(f"{flag}: ") + ".*" + re.escape(says)):
            mixture_overrides.apply(config, mixture_overrides.take([flag])[1])



@pytest.mark.slow
def test_a_mixture_run_logs_per_source_counts_and_eval_and_resumes_exactly(corpora, tmp_path, xla_compile_cache):
    """A micro pre-training on the 70/20/10 mixture: killed at step 4 and resumed, it logs the straight run's
    losses and per-source counts; each source gets its own eval row."""
    from test_pretrain import micro_config, read_metrics, train_losses  # noqa: PLC0415

    from bert_jax.train.loop import train_and_evaluate  # noqa: PLC0415

    def config():
        c = micro_config()
        c.data.mixture = corpora[0].mixture.to_dict()
        c.data.eval_fraction, c.data.num_eval_batches = 0.1, 1
        return c

    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    train_and_evaluate(config(), straight)
    train_and_evaluate(config(), resumed, stop_at_step=4)
    train_and_evaluate(config(), resumed)
    assert train_losses(straight) == train_losses(resumed)
    rows = read_metrics(straight)
    last = [r for r in rows if "data/books/sequences" in r][-1]
    assert last["step"] == 8
    assert sum(last[f"data/{n}/sequences"] for n in ("books", "web", "wiki")) == 8 * 8
    again = [r for r in read_metrics(resumed) if "data/books/sequences" in r][-1]
    assert {k: v for k, v in again.items() if k.startswith("data/")} == {
        k: v for k, v in last.items() if k.startswith("data/")}
    evals = [r for r in rows if "eval/loss" in r][-1]
    assert all(f"eval/{n}/loss" in evals and f"eval/{n}/mlm_accuracy" in evals for n in ("books", "web", "wiki"))


@pytest.mark.slow
def test_a_run_whose_stopping_source_runs_out_finishes_there_and_resumes_exactly(corpora, tmp_path,
                                                                                 xla_compile_cache):
    """wiki (on_exhausted="stop") runs out long before num_steps: the run ends at its last full batch with
    a checkpoint, an eval and DONE there, the metrics name wiki; one killed at step 4 and resumed ends alike."""
    from test_pretrain import micro_config, read_metrics, train_losses  # noqa: PLC0415

    from bert_jax.storage.workdir import Workdir  # noqa: PLC0415
    from bert_jax.run.completion import read_done  # noqa: PLC0415
    from bert_jax.train.loop import train_and_evaluate  # noqa: PLC0415

    def config():
        c = micro_config()
        c.data.mixture = corpora[0].mixture.to_dict()
        c.data.mixture.wiki.update(weight=0.6, on_exhausted="stop", eval_fraction=0.8)
        c.data.mixture.books.eval_fraction = 0.9
        c.data.eval_fraction, c.data.num_eval_batches = 0.1, 1
        c.train.num_steps = 1000
        return c

    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    train_and_evaluate(config(), straight)
    last = read_done(straight)["step"]
    assert 4 < last < 1000
    rows = read_metrics(straight)
    assert [r["step"] for r in rows if "data/wiki/exhausted" in r] == [last]
    assert max(r["step"] for r in rows) == last and any("eval/loss" in r and r["step"] == last for r in rows)
    assert Workdir(straight).checkpoint_steps()[-1] == last
    final = [r for r in rows if "data/books/epochs" in r][-1]
    assert final["data/wiki/epochs"] == 0 and final["data/books/epochs"] >= 1
    train_and_evaluate(config(), resumed, stop_at_step=4)
    assert read_done(resumed) is None
    train_and_evaluate(config(), resumed)
    assert train_losses(resumed) == train_losses(straight)
    assert read_done(resumed)["step"] == last


@pytest.mark.parametrize("weights", [(0.7, 0.2, 0.1), (0.25, 0.0, 0.75), (0.013, 0.5, 0.487)])
def test_the_mixer_draws_in_grain_mix_order(weights):
    """mixing.interleave_order is grain's IterDataset.mix order (computed in chunks, not per example)."""
    import grain  # noqa: PLC0415

    kept = [i for i, w in enumerate(weights) if w > 0]
    mixed = iter(grain.IterDataset.mix([grain.MapDataset.source([i]).repeat(None).to_iter_dataset() for i in kept],
                                       [weights[i] for i in kept]))
    order = np.flatnonzero(np.asarray(weights) > 0)[
        mixing.interleave_order(np.arange(3000), mixing.grain_proportions(weights))]
    assert order.tolist() == [next(mixed) for _ in range(3000)]


@pytest.mark.slow  # two processes joined by jax.distributed on localhost: about two minutes
def test_two_hosts_count_every_row_once_and_end_together(corpora, tmp_path):
    """A mixture on two processes: the per-source counts, summed over hosts, are the global batch's rows
    at every logged step; wiki (on_exhausted="stop") ends both hosts at the same step, DONE once."""
    import io  # noqa: PLC0415
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from test_pretrain import micro_overrides, read_metrics  # noqa: PLC0415

    from bert_jax.run.completion import read_done  # noqa: PLC0415
    from bert_jax.launch.local import run_local  # noqa: PLC0415

    mixture_sources = corpora[0].mixture.to_dict()
    mixture_sources["wiki"].update(weight=0.6, on_exhausted="stop", eval_fraction=0.8)
    mixture_sources["books"]["eval_fraction"] = 0.8
    config_file = tmp_path / "mixture_config.py"
    config_file.write_text(
        "from bert_jax.configs import tiny\n\n\ndef get_config():\n    c = tiny.get_config()\n"
        f"    c.data.mixture = {mixture_sources!r}\n"
        "    c.data.eval_fraction, c.data.num_eval_batches = 0.1, 1\n    return c\n")
    workdir = str(tmp_path / "run")
    out = io.StringIO()
    command = [sys.executable, "-m", "bert_jax.commands.pretrain", f"--config={config_file}", f"--workdir={workdir}",
               *micro_overrides(), "--config.train.num_steps=1000", "--config.train.log_every_steps=2",
               "--config.data.shuffle_window=16"]  # a window past wiki's share would end the run at once
    status = run_local(command, num_processes=2, devices_per_process=1, out=out, timeout_s=900)
    assert status == 0, out.getvalue()[-4000:]
    last = read_done(workdir)["step"]
    assert 2 < last < 1000
    rows = [r for r in read_metrics(workdir) if "data/books/sequences" in r]
    for row in rows:
        assert sum(row[f"data/{n}/sequences"] for n in ("books", "web", "wiki")) == row["step"] * 8, row
    assert rows[-1]["step"] == last and rows[-1]["data/wiki/exhausted"] == 1
    assert out.getvalue().count("ran out after step") == 2  # each host says so, at the same step
    assert f"ran out after step {last}" in out.getvalue()


def test_a_mixtures_counts_count_each_stream_once_when_processes_share_rows():
    """Processes whose devices hold the same rows (a context axis across them) read one stream: its sequences and
    tokens enter the logged totals once, not once per process; processes of their own rows are all summed."""
    from bert_jax.train.hooks import summed_over_shares

    per_process = np.array([[[3, 1], [300, 100], [0, 1]],  # process 0 (sequences, tokens, epochs per source)
                            [[3, 1], [300, 100], [0, 1]],  # process 1: the same rows as 0
                            [[2, 2], [200, 200], [1, 0]],  # process 2
                            [[2, 2], [200, 200], [1, 0]]])  # process 3: the same rows as 2
    np.testing.assert_array_equal(summed_over_shares(per_process, np.array([0, 0, 1, 1])),
                                  [[5, 3], [500, 300], [1, 1]])
    np.testing.assert_array_equal(summed_over_shares(per_process, np.arange(4)), [[10, 6], [1000, 600], [1, 1]])
