"""`bert-jax evaluate`: a battery of GLUE-layout tasks over seeds -> a scoreboard of medians; a killed battery
resumes without redoing finished runs; bad input fails before any training, naming the file or key, and leaves
nothing in OUT."""
import json
import os

import numpy as np
import pytest

import finetune_data as fd
from bert_jax.finetune import battery, scoreboard
from bert_jax.finetune.run import run as finetune_run
from bert_jax.configs.suites import load_suite

pytest.importorskip("torch")
pytest.importorskip("transformers")

STSB_HEADER = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
               "score"]


def write_tsv(path, header: list[str], rows: list[list[str]]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\t".join(header) + "\n" + "".join("\t".join(r) + "\n" for r in rows))


def write_glue(root, n_train: int = 256, n_dev: int = 64) -> str:
    """SST-2 (sentence, label 0/1) and STS-B (GLUE's 10 columns, a 0–5 score) in GLUE's layout, both learnable."""
    for split, n, seed in (("train", n_train, 0), ("dev", n_dev, 1)):
        write_tsv(f"{root}/SST-2/{split}.tsv", ["sentence", "label"],
                  [[r["sentence"], "1" if r["label"] == "pos" else "0"] for r in fd.sentiment_rows(n, seed)])
        # A pair whose score (0–5) is the first sentence's share of positive words; the second is a filler word.
        pairs = zip(fd.sentiment_rows(n, seed + 10), fd.sentiment_rows(n, seed + 100))
        write_tsv(f"{root}/STS-B/{split}.tsv", STSB_HEADER,
                  [[str(i), "main-news", "x", "2012", str(i), "none", "none", a["sentence"], b["sentence"].split()[0],
                    f"{5 * float(a['score']):.2f}"] for i, (a, b) in enumerate(pairs)])
    return str(root)


def micro_suite(seeds: int = 2):
    """The smoke suite at micro scale: a recipe a random tiny encoder learns from in a few steps."""
    suite = load_suite("smoke")
    suite.seeds = seeds
    for t in suite.tasks.values():
        t.learning_rates = (3e-3,)
        c = t.finetune
        c.data.max_seq_length, c.train.batch_size, c.train.epochs = 16, 32, 4.0
        c.model.dropout_rate = 0.0
        c.train.log_every_steps = 3
        c.checkpoint.async_save = False
    suite.tasks.stsb.finetune.train.epochs = 6.0  # regression needs a few more steps, as in test_finetune
    return suite


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return fd.write_tiny_hf_bert(str(tmp_path_factory.mktemp("tiny_hf")))


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    return write_glue(tmp_path_factory.mktemp("glue"))


class Killed(Exception):
    pass


def killed_after(n: int, calls: list):
    """bert_jax.finetune.run.run, raising (as a kill would) when asked for run n + 1; `calls` records each run."""

    def run(config, workdir, source=None):
        if len(calls) == n:
            raise Killed(workdir)
        calls.append(workdir)
        return finetune_run(config, workdir, source=source)

    return run


def check_board(board: dict, out, tasks: dict, seeds: int) -> None:
    """The scoreboard's medians, min–max and n are those of the runs' own results.json; its files agree."""
    assert set(board["tasks"]) == set(tasks)
    for name, metric in tasks.items():
        runs = sorted((out / "runs" / name).glob("lr=*/seed=*/results.json"))
        values = [json.loads(p.read_text())["validation"][metric] for p in runs]
        t = board["tasks"][name]
        assert len(values) == t["n"] == seeds and t["metric"] == metric
        assert t["median"] == pytest.approx(float(np.median(values)))
        assert (t["min"], t["max"]) == pytest.approx((min(values), max(values)))
        print(f"{name}: {metric} per seed {values}")
    assert board["average"] == pytest.approx(np.mean([t["median"] for t in board["tasks"].values()]))
    assert json.loads((out / "scoreboard.json").read_text()) == board
    table = (out / "scoreboard.md").read_text()
    assert all(f"| {name} | {metric} |" in table for name, metric in tasks.items()) and "average" in table
    assert (out / "scoreboard.csv").read_text().splitlines()[0].startswith("task,metric,median,min,max")
    assert (out / "scoreboard.png").read_bytes()[:4] == b"\x89PNG"


def test_battery_scores_medians_of_its_runs_and_resumes_without_redoing_them(hf_dir, glue_dir, tmp_path,
                                                                               xla_compile_cache, capsys):
    """One task, 2 seeds (the default suite's budget: one compile, shared by the second seed)."""
    out, suite, calls = tmp_path / "out", micro_suite(), []
    with pytest.raises(Killed):
        battery.evaluate(hf_dir, suite, str(out), glue_dir=glue_dir, tasks="sst2", finetune_fn=killed_after(1, calls))
    assert not (out / "scoreboard.json").exists()  # nothing claims a finished battery
    first = list(calls)
    board = battery.evaluate(hf_dir, suite, str(out), glue_dir=glue_dir, tasks="sst2",
                             finetune_fn=killed_after(99, calls))
    again = calls[len(first):]
    assert len(first) == 1 and len(again) == 1 and not set(first) & set(again)  # the finished run was kept
    assert "[evaluate] kept sst2 lr=0.003 seed=0: done before, accuracy " in capsys.readouterr().out  # and said so
    check_board(board, out, {"sst2": "accuracy"}, 2)
    assert board["tasks"]["sst2"]["median"] > 0.75  # the made task is learnable: it beats chance (0.5)
    assert (board["tasks"]["sst2"]["chance"], board["tasks"]["sst2"]["at_chance"], board["tasks_at_chance"]) == (
        0.5, False, 0)  # the runs recorded their chance (the majority class of the balanced made task)
    # Everything DONE: a third run trains nothing and gives the same board.
    assert battery.evaluate(hf_dir, suite, str(out), glue_dir=glue_dir, tasks="sst2",
                            finetune_fn=killed_after(0, [])) == board


def prepare_tfds_glue(glue: str, data_dir: str, tasks=("sst2", "stsb")) -> str:
    """TFDS's own GLUE builder (tensorflow_datasets/text/glue.py) prepares glue/<task> as ArrayRecord files from the
    GLUE-layout folder `glue`, which stands in for the zip it would download (the download manager hands it the
    folder, as TFDS's builder tests do); the preparation itself is TFDS's, without TensorFlow."""
    from unittest import mock

    tfds = pytest.importorskip("tensorflow_datasets")
    from tensorflow_datasets.text import glue as tfds_glue  # registers glue/*

    for folder, header in (("SST-2", "index\tsentence\n0\tgood\n"),
                           ("STS-B", "\t".join(STSB_HEADER[:-1]) + "\n" + "\t".join(["0"] * 7 + ["a", "b"]) + "\n")):
        with open(f"{glue}/{folder}/test.tsv", "w") as f:  # GLUE's unlabeled test split, which the builder reads too
            f.write(header)
    with mock.patch.object(tfds.download.DownloadManager, "download_and_extract", lambda self, url: glue):
        for task in tasks:
            tfds_glue.Glue(config=task, data_dir=data_dir, file_format="array_record").download_and_prepare()
    return data_dir


@pytest.fixture(scope="module")
def tfds_glue(glue_dir, tmp_path_factory):
    return prepare_tfds_glue(glue_dir, str(tmp_path_factory.mktemp("tfds")))


def test_tfds_prepared_glue_tasks_give_the_rows_of_the_glue_folder(glue_dir, tfds_glue):
    """--tfds_data_dir: glue/sst2 and glue/stsb as TFDS prepares them give the rows of GLUE's TSV files (labels by
    name, scores as numbers)."""
    key = lambda r: (r["text_a"], r.get("text_b", ""), r["label"])  # noqa: E731 (TFDS shuffles as it prepares)
    for task in ("sst2", "stsb"):
        from_tfds, from_tsv = battery.read_task(micro_suite(), task, "", tfds_glue), battery.read_task(
            micro_suite(), task, glue_dir)
        for split in ("train", "dev"):
            read, rows = getattr(from_tfds, split), getattr(from_tsv, split)
            if task == "stsb":  # (TFDS keeps the scores as float32)
                assert [float(r["label"]) for r in sorted(read, key=key)] == pytest.approx(
                    [float(r["label"]) for r in sorted(rows, key=key)], abs=1e-6)
                read, rows = [{**r, "label": ""} for r in read], [{**r, "label": ""} for r in rows]
            assert sorted(read, key=key) == sorted(rows, key=key)


@pytest.mark.slow  # one micro fine-tuning
def test_a_battery_trains_on_a_tfds_prepared_glue_task(hf_dir, tfds_glue, tmp_path, xla_compile_cache):
    board = battery.evaluate(hf_dir, micro_suite(seeds=1), str(tmp_path / "out"), tfds_data_dir=tfds_glue,
                             tasks="sst2")
    assert board["tasks"]["sst2"]["n"] == 1 and board["tasks"]["sst2"]["median"] > 0.75


@pytest.mark.slow
def test_two_tasks_three_seeds_killed_mid_battery_finish_without_redoing_runs(hf_dir, glue_dir, tmp_path,
                                                                             xla_compile_cache):
    """The acceptance battery: classification and regression, 3 seeds each, killed after 4 of its 6 runs."""
    out, suite, calls = tmp_path / "out", micro_suite(seeds=3), []
    with pytest.raises(Killed):
        battery.evaluate(hf_dir, suite, str(out), glue_dir=glue_dir, finetune_fn=killed_after(4, calls))
    first = list(calls)
    board = battery.evaluate(hf_dir, suite, str(out), glue_dir=glue_dir, finetune_fn=killed_after(99, calls))
    again = calls[len(first):]
    assert len(first) == 4 and len(again) == 2 and not set(first) & set(again)
    check_board(board, out, {"sst2": "accuracy", "stsb": "spearman"}, 3)
    assert board["tasks"]["sst2"]["median"] > 0.75 and board["tasks"]["stsb"]["median"] > 0.3


def test_best_learning_rate_is_the_best_median_and_its_seeds_are_the_row():
    runs = {battery.Run("t", lr, s, ""): {"validation": {"accuracy": v}}
            for lr, values in ((1e-5, (0.6, 0.9, 0.7)), (3e-5, (0.8, 0.5, 0.75))) for s, v in enumerate(values)}
    assert scoreboard.best_learning_rate("accuracy", runs) == 3e-5  # median 0.75 beats 0.7 (though 0.9 is the max)
    board = scoreboard.build({"checkpoint": "c", "suite": "s", "seeds": [0, 1, 2], "tasks": ["t"]},
                             {"t": "accuracy"}, runs)
    row = board["tasks"]["t"]
    assert (row["median"], row["min"], row["max"], row["n"], row["best_lr"]) == (0.75, 0.5, 0.8, 3, 3e-5)


def test_a_median_within_noise_of_chance_is_marked_and_the_average_counts_it():
    """The runs record their task's chance (the majority class: 0.5 here; a constant's correlation: 0) and the dev
    set's size (400: a margin of 2 x 0.5 / 20 = 0.05 for accuracy, 2 / 20 = 0.1 for a correlation)."""
    chance = {"accuracy": {"validation": {"accuracy": 0.5}, "examples": 400},
              "spearman": {"validation": {"spearman": 0.0}, "examples": 400}}
    scores = {"sst2": ("accuracy", (0.52, 0.54, 0.49)), "stsb": ("spearman", (0.62, 0.7, 0.66)),
              "cola": ("accuracy", (0.56, 0.57, 0.58))}
    runs = {battery.Run(t, 1e-4, s, ""): {"validation": {metric: v}, "chance": chance[metric]}
            for t, (metric, values) in scores.items() for s, v in enumerate(values)}
    board = scoreboard.build({"checkpoint": "c", "suite": "s", "seeds": [0, 1, 2], "tasks": list(scores)},
                             {t: metric for t, (metric, _) in scores.items()}, runs)
    assert [(board["tasks"][t]["chance"], board["tasks"][t]["at_chance"]) for t in scores] == [
        (0.5, True), (0.0, False), (0.5, False)]
    assert board["tasks"]["sst2"]["chance_margin"] == pytest.approx(0.05) and board["tasks_at_chance"] == 1
    table = scoreboard.markdown(board)
    assert "| sst2 | accuracy | 52.0 | 49.0–54.0 | 3 | — | 50.0 ± 5.0 | at chance |" in table
    assert "1 of 3 tasks at chance" in table
    header, *rows = scoreboard.csv_text(board).splitlines()
    assert header.endswith(",chance,chance_margin,at_chance") and rows[0].endswith(",0.5,0.05,True")
    # Runs that recorded no chance (older ones, a kind without a constant predictor) are not marked.
    bare = {r: {"validation": v["validation"]} for r, v in runs.items()}
    board = scoreboard.build({"checkpoint": "c", "suite": "s", "seeds": [0, 1, 2], "tasks": ["sst2"]},
                             {"sst2": "accuracy"}, bare)
    assert board["tasks"]["sst2"]["at_chance"] is None and board["tasks_at_chance"] == 0


def test_a_row_whose_runs_learned_nothing_says_so_whatever_its_median():
    """A balanced SST-2 layout where every seed was diagnosed "learns nothing": a median of 55.2, just past the
    margin of chance, must not read as a score."""
    chance = {"validation": {"accuracy": 0.5}, "examples": 400}
    runs = {battery.Run("sst2", 1e-4, s, ""): {"validation": {"accuracy": v}, "chance": chance,
                                               "diagnosis": {"name": "learns nothing", "advice": "..."}}
            for s, v in enumerate((0.552, 0.56, 0.551))}
    runs[battery.Run("cola", 1e-4, 0, "")] = {"validation": {"accuracy": 0.8}, "chance": chance,
                                              "diagnosis": {"name": "just right", "advice": "..."}}
    board = scoreboard.build({"checkpoint": "c", "suite": "s", "seeds": [0, 1, 2], "tasks": ["sst2", "cola"]},
                             {"sst2": "accuracy", "cola": "accuracy"}, runs)
    row = board["tasks"]["sst2"]
    assert (row["median"], row["at_chance"], row["verdicts"]) == (0.552, False, {"learns nothing": 3})
    assert (board["tasks_at_chance"], board["tasks_learning_nothing"]) == (0, 1)
    table = scoreboard.markdown(board)
    assert "| sst2 | accuracy | 55.2 | 55.1–56.0 | 3 | — | 50.0 ± 5.0 | learns nothing 3/3 |" in table
    assert "| cola | accuracy | 80.0 | 80.0–80.0 | 1 | — | 50.0 ± 5.0 |  |" in table
    assert "1 of 2 tasks learn nothing" in table
    assert ",learns nothing=3,0.5," in scoreboard.csv_text(board)


def test_tasks_that_start_from_another_run_after_it():
    suite = micro_suite()
    suite.start_from_mnli = True
    suite.tasks.sst2.init_from_task = "stsb"
    assert battery.select_tasks(suite, "sst2") == ["stsb", "sst2"]  # the task it starts from runs first
    suite.start_from_mnli = False
    assert battery.select_tasks(suite, "sst2") == ["sst2"]


@pytest.mark.slow
def test_a_task_starts_from_the_fine_tuned_encoder_of_the_task_it_names(hf_dir, glue_dir, tmp_path,
                                                                          xla_compile_cache):
    """start_from_mnli: STS-B starts from SST-2's fine-tuned encoder of the same seed (here SST-2 plays MNLI)."""
    suite = micro_suite(seeds=1)
    suite.start_from_mnli = True
    suite.tasks.stsb.init_from_task = "sst2"
    board = battery.evaluate(hf_dir, suite, str(tmp_path / "out"), glue_dir=glue_dir, tasks="stsb")
    assert set(board["tasks"]) == {"sst2", "stsb"}
    config = json.loads((tmp_path / "out" / "runs" / "stsb" / "lr=0.003" / "seed=0" / "config.json").read_text())
    assert config["init_from"] == str(tmp_path / "out" / "runs" / "sst2" / "lr=0.003" / "seed=0")  # its run
    plain = battery.evaluate(hf_dir, micro_suite(seeds=1), str(tmp_path / "plain"), glue_dir=glue_dir, tasks="stsb")
    assert board["tasks"]["stsb"]["scores"] != plain["tasks"]["stsb"]["scores"]  # another encoder, another score


# --- bad input: fails before any training, naming the file or key; nothing written in OUT ----------------------

def _refused(tmp_path, says: str, checkpoint: str, glue: str, suite=None, tasks: str = "") -> None:
    out = tmp_path / "out"
    with pytest.raises(ValueError) as error:
        battery.evaluate(checkpoint, suite or micro_suite(), str(out), glue_dir=glue, tasks=tasks,
                         finetune_fn=lambda *a, **k: pytest.fail("trained despite bad input"))
    assert says in str(error.value), str(error.value)
    assert not out.exists(), "OUT was written despite bad input"


def test_a_missing_task_directory_is_named(hf_dir, tmp_path):
    glue = write_glue(tmp_path / "glue", 8, 4)
    os.rename(f"{glue}/STS-B", f"{glue}/STS-B.moved")
    _refused(tmp_path, f"{glue}/STS-B does not exist", hf_dir, glue)


def test_a_header_that_does_not_match_the_reader_names_the_file_and_columns(hf_dir, tmp_path):
    glue = write_glue(tmp_path / "glue", 8, 4)
    write_tsv(f"{glue}/SST-2/dev.tsv", ["text", "label"], [["good", "1"]])
    _refused(tmp_path, f"{glue}/SST-2/dev.tsv: the header ['text', 'label'] lack ['sentence']", hf_dir, glue)


def test_a_label_outside_the_task_set_names_the_file_and_row(hf_dir, tmp_path):
    glue = write_glue(tmp_path / "glue", 8, 4)
    write_tsv(f"{glue}/SST-2/train.tsv", ["sentence", "label"], [["good", "1"], ["bad", "0"], ["meh", "2"]])
    _refused(tmp_path, f"{glue}/SST-2/train.tsv, row 3: label '2' is outside task sst2's set", hf_dir, glue)


def test_an_unknown_task_and_a_bad_checkpoint_are_named(hf_dir, tmp_path):
    glue = write_glue(tmp_path / "glue", 8, 4)
    _refused(tmp_path, "--tasks: ['mnli'] not in suite 'smoke'", hf_dir, glue, tasks="mnli")
    _refused(tmp_path, f"--checkpoint={tmp_path}", str(tmp_path), glue)


def test_a_checkpoint_whose_family_cannot_fine_tune_is_named(hf_dir, tmp_path):
    glue = write_glue(tmp_path / "glue", 8, 4)
    alien = tmp_path / "alien"
    alien.mkdir()
    for name in os.listdir(hf_dir):
        os.symlink(os.path.join(hf_dir, name), alien / name)
    (alien / "config.json").unlink()
    config = json.loads(open(os.path.join(hf_dir, "config.json")).read())
    (alien / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    _refused(tmp_path, "--checkpoint=", str(alien), glue)


def test_an_out_of_another_checkpoint_is_refused(hf_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "battery.json").write_text(json.dumps({"checkpoint": "/elsewhere", "suite": "smoke"}))
    glue = write_glue(tmp_path / "glue", 8, 4)
    with pytest.raises(ValueError, match="holds a battery with other checkpoint"):
        battery.evaluate(hf_dir, micro_suite(), str(out), glue_dir=glue,
                         finetune_fn=lambda *a, **k: pytest.fail("trained despite bad input"))


@pytest.mark.slow
def test_a_workdir_and_its_exported_hf_folder_score_the_same(hf_dir, glue_dir, tmp_path, xla_compile_cache):
    """The same encoder as a pre-training workdir and as its Hugging Face export: the same scores, seed for seed."""
    from test_pretrain import micro_config as pretrain_micro_config

    from bert_jax.train.export import export
    from bert_jax.train.loop import train_and_evaluate

    hf_cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    c = pretrain_micro_config()
    c.init_from_hf = hf_dir
    c.model.vocab_size, c.model.num_heads, c.model.max_position_embeddings = hf_cfg["vocab_size"], 2, 64
    c.model.scan_layers = False
    c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 5
    c.train.num_steps = c.train.eval_every_steps = c.checkpoint.every_steps = 2
    c.logging.plots = False
    workdir = str(tmp_path / "pretrain")
    train_and_evaluate(c, workdir)
    exported = str(tmp_path / "exported")
    export(workdir, exported)
    boards = [battery.evaluate(source, micro_suite(seeds=1), str(tmp_path / name), glue_dir=glue_dir, tasks="sst2")
              for name, source in (("from_workdir", workdir), ("from_hf", exported))]
    assert boards[0]["tasks"]["sst2"]["scores"] == pytest.approx(boards[1]["tasks"]["sst2"]["scores"], abs=1e-6)


def test_the_ray_executor_needs_an_address_and_a_bucket_unless_slices_are_one_host(tmp_path):
    from argparse import Namespace

    from bert_jax.launch import executors

    with pytest.raises(ValueError, match="--executor=ray needs --address"):
        executors.check_ray(Namespace(address="", tpu="v4-8"), str(tmp_path), "--out")
    with pytest.raises(ValueError, match=f"give a gs:// or s3:// --out, not '{tmp_path}'"):
        executors.check_ray(Namespace(address="h:6379", tpu="v4-32"), str(tmp_path), "--out")
    executors.check_ray(Namespace(address="h:6379", tpu="v4-8"), str(tmp_path), "--out")  # one host: a local disk
    executors.check_ray(Namespace(address="h:6379", tpu="v4-32"), "gs://b/out", "--out")


# --- row caps: a seeded sample of the whole file, stratified by label (issue 51) ----------------------------------

def write_sorted_sst2(root, n_train: int, n_dev: int) -> str:
    """SST-2 in GLUE's layout, every file sorted by label (as many exported datasets are): the head of train.tsv
    holds one class."""
    for split, n, seed in (("train", n_train, 0), ("dev", n_dev, 1)):
        rows = sorted(fd.sentiment_rows(n, seed), key=lambda r: r["label"])
        write_tsv(f"{root}/SST-2/{split}.tsv", ["sentence", "label"],
                  [[r["sentence"], "1" if r["label"] == "pos" else "0"] for r in rows])
    return str(root)


def test_a_capped_task_draws_a_seeded_sample_of_the_whole_file_stratified_by_label(glue_dir, tmp_path):
    glue = write_sorted_sst2(tmp_path / "glue", 300, 100)
    suite = micro_suite()
    suite.tasks.sst2.max_train_rows, suite.tasks.sst2.max_dev_rows = 90, 40
    short = battery.read_task(suite, "sst2", glue)
    assert (battery.label_counts(short.train), battery.label_counts(short.dev)) == ({"0": 45, "1": 45},
                                                                                    {"0": 20, "1": 20})
    whole = battery.read_task(micro_suite(), "sst2", glue)
    assert [whole.train.index(r) for r in short.train] == sorted(whole.train.index(r) for r in short.train)
    assert battery.read_task(suite, "sst2", glue).train == short.train  # the seed draws it
    suite.tasks.sst2.sample_seed = 1
    assert battery.read_task(suite, "sst2", glue).train != short.train
    assert short.samples["train"] == {
        "source": f"{glue}/SST-2/train.tsv", "rows": 300, "kept": 90, "max_train_rows": 90, "sample_seed": 0,
        "stratified_by_label": True, "label_counts": {"0": 45, "1": 45}, "file_label_counts": {"0": 150, "1": 150}}
    battery.write_data(str(tmp_path / "out"), {"sst2": short})  # recorded beside the rows the runs read
    assert json.loads((tmp_path / "out" / "data" / "sst2" / "sample.json").read_text()) == short.samples
    # A regression is a plain seeded sample, not the head either.
    suite.tasks.stsb.max_train_rows = 20
    stsb, all_stsb = battery.read_task(suite, "stsb", glue_dir), battery.read_task(micro_suite(), "stsb", glue_dir)
    assert len(stsb.train) == 20 and stsb.train != all_stsb.train[:20] and stsb.samples["train"]["sample_seed"] == 0
    assert load_suite("smoke").tasks.sst2.max_train_rows == 1000  # the probe's suite stays short on real GLUE


def test_a_stratified_sample_keeps_every_label_and_each_its_share():
    rows = [{"label": "a"}] * 90 + [{"label": "b"}] * 9 + [{"label": "c"}]
    assert battery.label_counts(battery.sample_rows(rows, 10, 0, stratified=True)) == {"a": 8, "b": 1, "c": 1}
    assert battery.label_counts(battery.sample_rows(rows, 2, 0, stratified=True)) == {"b": 1, "c": 1}
    assert battery.sample_rows(rows, 0, 0, True) == rows and battery.sample_rows(rows, 500, 0, True) == rows


def test_a_task_whose_rows_hold_one_label_fails_naming_the_file_the_cap_and_the_counts(hf_dir, tmp_path):
    glue = write_glue(tmp_path / "glue", 8, 4)
    write_tsv(f"{glue}/SST-2/train.tsv", ["sentence", "label"], [[f"good {i}", "1"] for i in range(30)])
    suite = micro_suite()
    suite.tasks.sst2.max_train_rows = 20
    _refused(tmp_path, f"{glue}/SST-2/train.tsv: the train rows of task sst2 hold one label {{'1': 20}} "
                       f"(tasks.sst2.max_train_rows=20, 30 rows)", hf_dir, glue, suite=suite)
    dev_of_one = write_glue(tmp_path / "glue2", 8, 4)
    write_tsv(f"{dev_of_one}/SST-2/dev.tsv", ["sentence", "label"], [["bad", "0"], ["worse", "0"]])
    _refused(tmp_path, f"{dev_of_one}/SST-2/dev.tsv: the dev rows of task sst2 hold one label {{'0': 2}} "
                       f"(tasks.sst2.max_dev_rows=500, 2 rows)", hf_dir, dev_of_one)


@pytest.mark.slow
def test_evaluate_on_a_label_sorted_sst2_from_minilm_scores_well_above_chance(tmp_path):
    """The acceptance of issue 51: `bert-jax evaluate --suite=smoke --tasks=sst2` from the packaged MiniLM on a
    GLUE-layout SST-2 whose train.tsv is sorted by label. Its 1,000-row cap once took the head of the file (every
    row label 0) and scored 50.0 [50.0–50.0]; a sample of the whole file learns the task."""
    import subprocess
    import sys

    from test_finetune import minilm_dir

    glue, out = write_sorted_sst2(tmp_path / "glue", 1500, 600), tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "bert_jax.cli", "evaluate", f"--checkpoint={minilm_dir()}",
                           "--suite=smoke", "--tasks=sst2", f"--glue_dir={glue}", f"--out={out}"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout)
    sample = json.loads((out / "data" / "sst2" / "sample.json").read_text())
    assert sample["train"]["label_counts"] == {"0": 500, "1": 500} and sample["dev"]["kept"] == 500
    t = scoreboard.read(str(out))["tasks"]["sst2"]
    assert t["chance"] == 0.5 and not t["at_chance"] and t["median"] > 0.8, t
