"""Every registered family through every command that takes a run (issue 76): a family added without one of them
fails here, with no table to edit.

Each family's own tiny config (the configs/*.py whose `:tiny` variant names it; configs/tiny.py for BERT), shrunk to
micro shapes, pre-trains 2 steps once per family; then, in-process against that run: `inspect` in every mode
(fill_mask, attention, heads, goodput), `export` (transformers' AutoModel loads it with our encoder's states, and
inspect reads the export as it reads the run), `average`, a branch (`branch_from`), fine-tuning's `init_from` and
`evaluate`. The run and the commands cost minutes, so they run with -m slow; the default suite's share is
tests/test_family_conformance.py (each family's module, as inspect and export read it, at micro shapes).
"""
import importlib
import json
import os
import pkgutil

import numpy as np
import pytest

import bert_jax.configs
import bert_jax.configs.finetune.classification
import finetune_data as fd
from bert_jax.commands.average import average
from bert_jax.commands.inspect import inspect
from bert_jax.families import known_families
from bert_jax.finetune import battery
from bert_jax.finetune.run import finetune
from bert_jax.inspect import head_statistics, views
from bert_jax.run.completion import read_done
from bert_jax.train.export import export
from bert_jax.train.loop import train_and_evaluate
from numerics import TRANSFORMERS, assert_close

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_evaluate import micro_suite, write_glue  # noqa: E402
from test_pretrain import train_losses  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TEXT = "the history of the [MASK] is long ."
EMBEDDED_DEFAULT = "tiny"  # configs/tiny.py: the embedded default (BERT), tiny without a variant


def tiny_configs() -> dict[str, object]:
    """{family: the config module whose tiny variant trains it}: configs/tiny.py, and every `get_config("tiny")`;
    where several name one family, the one named after it (configs/modernbert_base.py, not crammed.py)."""
    found: dict[str, list] = {}
    for info in sorted(pkgutil.iter_modules(bert_jax.configs.__path__), key=lambda m: m.name):
        if info.ispkg:
            continue
        module = importlib.import_module(f"bert_jax.configs.{info.name}")
        try:
            config = module.get_config() if info.name == EMBEDDED_DEFAULT else module.get_config("tiny")
        except (TypeError, ValueError):  # no tiny variant
            continue
        found.setdefault(config.model.family, []).append((info.name, module))
    return {family: next((m for name, m in candidates if name.startswith(family)), candidates[0][1])
            for family, candidates in found.items()}


TINY = tiny_configs()


def test_every_registered_family_has_a_tiny_config():
    missing = set(known_families()) - set(TINY)
    assert not missing, f"no configs/*.py with a tiny variant trains {sorted(missing)}"


def micro_config(family: str):
    """The family's tiny config at micro shapes, 2 steps, a checkpoint after each (a branch point at step 1)."""
    module = TINY[family]
    c = module.get_config() if module.__name__.endswith(f".{EMBEDDED_DEFAULT}") else module.get_config("tiny")
    c.model.vocab_size = 1024
    c.model.hidden_size = 32
    c.model.num_layers = 2
    c.model.num_heads = 2
    c.model.intermediate_size = 64
    c.data.num_eval_batches = 1
    c.data.tokenizer.sample_bytes = 1_000_000  # plenty for 1024 tokens; every tokenizer kind trains in seconds
    c.train.global_batch_size = 4
    c.train.num_steps = 2
    c.train.warmup_steps = 1
    c.train.log_every_steps = 1
    c.train.eval_every_steps = 2
    c.checkpoint.every_steps = 1
    c.checkpoint.max_to_keep = 2
    c.logging.plots = False
    c.logging.peak_flops_per_device = 1e11  # skip the matmul measurement
    return c


@pytest.fixture(scope="module", params=sorted(known_families()))
def run(request, tmp_path_factory, xla_compile_cache):
    """(family, a finished 2-step micro run of it)."""
    family = request.param
    workdir = str(tmp_path_factory.mktemp(f"{family}_run"))
    train_and_evaluate(micro_config(family), workdir)
    assert read_done(workdir)["step"] == 2
    return family, workdir


@pytest.mark.slow
def test_inspect_reads_a_run_in_every_mode(run, tmp_path):
    family, workdir = run
    [line] = list(inspect(workdir, "fill_mask", text=TEXT, top_k=3))
    assert line.startswith("mask 1: ") and len(line.split(",")) == 3
    png = tmp_path / "attention.png"
    [line] = list(inspect(workdir, "attention", text=TEXT, out=str(png)))
    assert line.startswith("attention of 2 layers x 2 heads") and png.read_bytes()[:8] == PNG_MAGIC
    out = tmp_path / "heads"
    [line] = list(inspect(workdir, "heads", out=str(out), max_sentences=4))  # the run's own eval split
    assert line.startswith("heads: 2 layers x 2 heads over 4 sentences")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["heads.csv", "heads.json", "heads.md", *(f"heads_{name}.png" for name in head_statistics.STATISTICS)])
    assert len(json.loads((out / "heads.json").read_text())["heads"]) == 4
    goodput = list(inspect(workdir, "goodput"))
    assert goodput[-1].startswith("goodput ") and goodput[-1].endswith(" %")


@pytest.mark.slow
def test_export_loads_in_transformers_with_our_encoders_states(run, tmp_path):
    """transformers' AutoModel of the export gives the states of our `encode` (the encoder fine-tuning starts from),
    and inspect reads the export as it reads the run."""
    family, workdir = run
    out = str(tmp_path / "hf")
    export(workdir, out)
    ours = views.load(workdir)
    ids, _ = views.encode(ours.tokenizer, TEXT.replace("[MASK]", "list"), ours.max_length)
    batch = {"input_ids": ids[None], "attention_mask": np.ones_like(ids)[None], "token_type_ids": 0 * ids[None]}
    hidden = np.asarray(ours.apply(batch, "encode")["hidden"])
    model = transformers.AutoModel.from_pretrained(out).eval()
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                       attention_mask=torch.tensor(batch["attention_mask"], dtype=torch.long)).last_hidden_state
    print(f"{family}: {type(model).__name__}")
    assert_close(hidden, theirs.numpy(), TRANSFORMERS)
    assert_close(views.attention_maps(views.load(out), TEXT)[1], views.attention_maps(ours, TEXT)[1], TRANSFORMERS)


@pytest.mark.slow
def test_an_average_of_a_run_with_itself_is_it_and_inspects_like_it(run, tmp_path):
    family, workdir = run
    out = str(tmp_path / "average")
    assert average(f"{workdir}:1,{workdir}:1", None, out) == 1
    lines = list(inspect(out, "fill_mask", text=TEXT))
    assert lines[0].startswith("averaged from: ")
    assert lines[1:] == list(inspect(f"{workdir}:1", "fill_mask", text=TEXT))


@pytest.mark.slow
def test_a_branch_that_changes_nothing_repeats_its_parent(run, tmp_path):
    family, workdir = run
    branch = micro_config(family)
    branch.branch_from = f"{workdir}:1"
    train_and_evaluate(branch, str(tmp_path / "branch"))
    assert train_losses(str(tmp_path / "branch")) == [(2, dict(train_losses(workdir))[2])]  # bit for bit
    assert [line.split(":")[0] for line in views.provenance(str(tmp_path / "branch"))] == ["lineage"]


# Fine-tuning reads offsets and word ids from a `tokenizers.Tokenizer`; a run whose tokenizer is a bare unigram
# SentencePiece model (ALBERT's, DeBERTa-v3's tiny configs) has none, and fine-tuning and evaluate refuse it in a line.
NO_FAST_TOKENIZER = "fine-tuning needs a tokenizer with offsets and word ids"


def fine_tunes(workdir: str) -> bool:
    from bert_jax.storage.workdir import Workdir
    from data_pipelines.tokenizers.tokenizer import load_tokenizer

    return load_tokenizer(str(Workdir(workdir).tokenizer)).fast_tokenizer() is not None


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("family_commands_data")
    return {"train.csv": fd.write_csv(d / "train.csv", fd.sentiment_rows(16, 0)),
            "test.csv": fd.write_csv(d / "test.csv", fd.sentiment_rows(8, 1)), "glue": write_glue(d / "glue", 64, 16)}


@pytest.mark.slow
def test_finetuning_starts_from_a_run(run, data, tmp_path):
    family, workdir = run
    c = bert_jax.configs.finetune.classification.get_config()
    c.init_from = workdir
    c.data.train, c.data.test = data["train.csv"], data["test.csv"]
    c.data.max_seq_length, c.model.dropout_rate = 32, 0.0
    c.train.batch_size, c.train.epochs, c.train.log_every_steps = 8, 1.0, 1
    c.checkpoint.async_save, c.checkpoint.every_steps, c.logging.plots = False, 1000, False
    if not fine_tunes(workdir):
        with pytest.raises(ValueError, match=NO_FAST_TOKENIZER):
            finetune(c, str(tmp_path / "finetune"))
        return
    finetune(c, str(tmp_path / "finetune"))
    with open(tmp_path / "finetune" / "config.json") as f:
        assert json.load(f)["model"]["family"] == family
    losses = [row["train/loss"] for row in map(json.loads, open(tmp_path / "finetune" / "metrics.jsonl"))
              if "train/loss" in row]
    assert len(losses) == 2 and np.all(np.isfinite(losses))


@pytest.mark.slow
def test_evaluate_scores_a_run(run, data, tmp_path):
    family, workdir = run
    suite = micro_suite(seeds=1)
    suite.tasks.sst2.finetune.train.epochs = 1.0
    evaluate = lambda: battery.evaluate(workdir, suite, str(tmp_path / "evaluate"), glue_dir=data["glue"],  # noqa: E731
                                        tasks="sst2")
    if not fine_tunes(workdir):
        with pytest.raises(ValueError, match=rf"--checkpoint={workdir}: .*{NO_FAST_TOKENIZER}"):
            evaluate()
        return
    board = evaluate()
    row = board["tasks"]["sst2"]
    assert row["n"] == 1 and len(row["scores"]) == 1 and np.isfinite(row["median"])


def test_a_teacher_with_fewer_positions_than_the_students_rows_is_refused_naming_both(tmp_path):
    """Before: an ALBERT teacher of 64 positions under a student of 128-token rows gathered NaN positions, and the
    run stopped at step 1 on a non-finite loss."""
    from bert_jax.storage.workdir import Workdir
    from bert_jax.train import teacher as teacher_lib
    from test_workdir import write_config_as_a_run_does

    taught = micro_config("bert")
    taught.model.max_position_embeddings = 64
    write_config_as_a_run_does(tmp_path, taught)
    (tmp_path / "checkpoints" / "2").mkdir(parents=True)
    assert Workdir(str(tmp_path)).checkpoint_steps() == [2]
    student = micro_config("distilbert")
    student.distill.teacher, student.data.max_seq_length = str(tmp_path), 128
    with pytest.raises(ValueError, match=r"max_seq_length=128 but the teacher .* at most max_position_embeddings=64"):
        teacher_lib.resolve_teacher(student)


@pytest.mark.slow
def test_a_run_is_a_distillation_teacher_or_fails_naming_it(run, tmp_path):
    """A run teaches a DistilBERT student for a step; a replaced-token detector, whose forward samples its own
    input, fails before compiling, naming the path."""
    from bert_jax.families import model_for
    from bert_jax.models.replaced_token_detection import ReplacedTokenDetection
    from bert_jax.storage.workdir import Workdir
    from bert_jax.train import teacher as teacher_lib

    family, workdir = run
    student = micro_config("distilbert")
    student.distill.teacher = workdir
    taught = Workdir(workdir).config()  # the student reads the teacher's tokenizer, at lengths the teacher reads
    student.model.pad_token_id = taught.model.get("pad_token_id", student.model.pad_token_id)
    student.data.max_seq_length = taught.data.max_seq_length
    student.train.num_steps = student.train.eval_every_steps = 1
    if isinstance(model_for(taught.model), ReplacedTokenDetection):
        with pytest.raises(ValueError, match=rf"teacher='{workdir}' is a {family} model, which does not run"):
            teacher_lib.resolve_teacher(student)
        return
    train_and_evaluate(student, str(tmp_path / "student"))
    [(step, loss)] = train_losses(str(tmp_path / "student"))
    assert step == 1 and np.isfinite(loss)


@pytest.mark.slow
def test_extend_vocab_grows_a_run(run, tmp_path):
    from bert_jax.vocab.extension import ExtendRequest, extend_vocab

    family, workdir = run
    corpus = tmp_path / "domain.txt"
    corpus.write_text("acetaminophen and ibuprofen , acetaminophen or ibuprofen .\n" * 20)
    report = extend_vocab(ExtendRequest(source=workdir, corpus=str(corpus), out=str(tmp_path / "extended"), add=2))
    assert sorted(w["word"] for w in report["words"]) == ["acetaminophen", "ibuprofen"]
    transformers.AutoModel.from_pretrained(str(tmp_path / "extended"))
