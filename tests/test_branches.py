"""Branches (config.branch_from=DIR:STEP, bert_jax/train/branch.py): a new workdir that goes on from another run's
checkpoint. A branch that changes nothing trains its parent's next steps bit for bit; the parent is never written;
a decay branch goes on from the parent's learning rate; the lineage is recorded."""
import hashlib
import json
import os
import sys

import pytest

from bert_jax.checkpoint import reference
from bert_jax.run.completion import read_done
from bert_jax.train.optimizer import learning_rate_schedule

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import with_changes  # noqa: E402
from test_pretrain import micro_config, read_metrics, train_losses  # noqa: E402


@pytest.mark.parametrize("text, parsed", [
    ("runs/a:100", ("runs/a", 100, False)), ("runs/a:last", ("runs/a", "last", False)), ("runs/a", ("runs/a", None, False)),
    ("runs/a:100:ema", ("runs/a", 100, True)), ("gs://b/runs/a:last:ema", ("gs://b/runs/a", "last", True)),
    ("gs://b/runs/a", ("gs://b/runs/a", None, False)),
])
def test_a_checkpoint_is_named_dir_step_ema(text, parsed):
    assert reference.split(text) == parsed


def test_a_decay_starts_at_the_rate_it_is_given_and_ends_at_the_end_rate():
    train = micro_config().train
    train.update(dict(schedule="decay", decay_from_step=100, decay_from_learning_rate=1e-3, decay_steps=50,
                      end_learning_rate=0.0))
    for shape in ("linear", "1-sqrt"):
        train.decay_shape = shape
        schedule = learning_rate_schedule(train)
        rates = [float(schedule(step - 1)) for step in range(101, 151)]  # step s trains at schedule(s - 1)
        assert rates[0] == pytest.approx(1e-3) and rates[-1] == 0.0
        assert all(a >= b for a, b in zip(rates, rates[1:]))
    assert float(schedule(125 - 1)) == pytest.approx(1e-3 * (1 - (24 / 49) ** 0.5))


def _tree_digest(folder: str) -> str:
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            path = os.path.join(root, name)
            digest.update(path.encode())
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def _parent_config():
    c = micro_config()  # 8 steps, checkpoints at 4 and 8
    c.train.schedule = "wsd"
    return c


@pytest.fixture(scope="module")
def parent(tmp_path_factory, xla_compile_cache):
    from bert_jax.train.loop import train_and_evaluate  # noqa: PLC0415

    workdir = str(tmp_path_factory.mktemp("parent"))
    train_and_evaluate(_parent_config(), workdir)
    return workdir


def _branch(parent_dir, workdir, **changes):
    from bert_jax.train.loop import train_and_evaluate  # noqa: PLC0415

    train_and_evaluate(with_changes(_parent_config(), **changes), workdir)
    with open(os.path.join(workdir, "config.json")) as f:
        return json.load(f)


@pytest.mark.slow  # a parent and two branches of the micro run: ~2 minutes on 2 cores
def test_a_branch_that_changes_nothing_trains_the_parents_steps_bit_for_bit(parent, tmp_path):
    before = _tree_digest(parent)
    recorded = _branch(parent, str(tmp_path / "b"), branch_from=f"{parent}:4")
    parent_losses = dict(train_losses(parent))
    branch_losses = train_losses(str(tmp_path / "b"))
    assert [s for s, _ in branch_losses] == [5, 6, 7, 8]
    assert all(loss == parent_losses[s] for s, loss in branch_losses)  # bit for bit
    assert _tree_digest(parent) == before  # the parent was only read
    assert recorded["branch"]["data"] == "continued"
    assert [(e["workdir"], e["step"]) for e in recorded["lineage"]] == [(parent, 4)]
    # A branch of the branch records both ancestors, root first.
    grandchild = _branch(parent, str(tmp_path / "c"), branch_from=f"{tmp_path / 'b'}:last",
                         train__num_steps=10, accept_changes="")
    assert [(e["workdir"], e["step"]) for e in grandchild["lineage"]] == [(parent, 4), (str(tmp_path / "b"), 8)]
    assert grandchild["branch_from"] == f"{tmp_path / 'b'}:8"
    # A resume of a branch reads its own record, not the parent, which may be gone: the same command trains on.
    os.rename(parent, parent + ".away")
    try:
        resumed = _branch(parent, str(tmp_path / "b"), branch_from=f"{parent}:last", train__num_steps=10,
                          accept_changes="train.num_steps")
    finally:
        os.rename(parent + ".away", parent)
    assert resumed["branch_from"] == f"{parent}:4" and resumed["branch"] == recorded["branch"]
    assert [s for s, _ in train_losses(str(tmp_path / "b"))] == [5, 6, 7, 8, 9, 10]


@pytest.mark.slow  # three branches of the micro run: ~2 minutes on 2 cores
def test_a_decay_branch_goes_on_from_the_parents_rate_to_the_end_rate(parent, tmp_path):
    recorded = _branch(parent, str(tmp_path / "d"), branch_from=f"{parent}:4", train__schedule="decay",
                       train__decay_steps=3, train__decay_shape="linear")
    rates = {r["step"]: r["train/learning_rate"] for r in read_metrics(str(tmp_path / "d"))
             if "train/learning_rate" in r}
    parent_rates = {r["step"]: r["train/learning_rate"] for r in read_metrics(parent) if "train/learning_rate" in r}
    assert sorted(rates) == [5, 6, 7] and recorded["train"]["num_steps"] == 7
    assert rates[5] == pytest.approx(parent_rates[5]) and rates[6] == pytest.approx(parent_rates[5] / 2)
    assert rates[7] == 0.0
    assert read_done(str(tmp_path / "d"))["step"] == 7
    # Other data (a mask rate) and fresh moments: a new seeded order, said in the config, the step going on.
    other = _branch(parent, str(tmp_path / "o"), branch_from=f"{parent}:4", data__mask_rate=0.3,
                    data__max_predictions_per_seq="auto", branch__reset_optimizer=True)
    assert other["branch"]["data"] == "reseeded" and other["data"]["max_predictions_per_seq"] == 20
    assert [s for s, _ in train_losses(str(tmp_path / "o"))] == [5, 6, 7, 8]
    # An EMA the parent did not keep starts at the branch's params; the moments still go on: the parent's losses.
    _branch(parent, str(tmp_path / "e"), branch_from=f"{parent}:4", train__ema_decay=0.5)
    parent_losses = dict(train_losses(parent))
    assert [(s, pytest.approx(parent_losses[s], rel=1e-6)) for s, _ in train_losses(str(tmp_path / "e"))] == \
        train_losses(str(tmp_path / "e"))
