"""docs/guides/recipes.md's chain, run as written: ModernBERT's stable phase, a context-extension branch, two decay
branches, their average and a scoreboard, on the tiny configs. Then what each step promised: the steps each run
ends at, the lineage, the average's parameters, the context extension exported and loaded by transformers with
its new length and theta."""
import json
import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from test_cli import DRIVER
from test_evaluate import write_glue

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "recipes.md"


def guide_commands() -> list[list[str]]:
    """The `bert-jax` lines of the guide's first bash block, continuations joined, without `bert-jax`."""
    block = re.search(r"```bash\n(.*?)```", GUIDE.read_text(), re.S).group(1)
    lines = block.replace("\\\n", " ").splitlines()
    return [shlex.split(line)[1:] for line in lines if line.startswith("bert-jax ")]


def test_the_guide_names_the_chain_it_promises():
    commands = guide_commands()
    assert [c[0] for c in commands] == ["pretrain"] * 4 + ["average", "evaluate"]
    assert sum("--config.branch_from=runs/mb_ctx:last" in c for c in commands) == 2


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipes")
    (root / "configs").symlink_to(ROOT / "configs")
    write_glue(root / "data" / "glue", n_train=64, n_dev=32)
    commands = guide_commands()
    commands[-1] += ["--tasks=sst2", "--seeds=1"]  # one task, one seed: the path, not a verdict
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(commands)], capture_output=True, text=True,
                          timeout=1800, cwd=root, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                                       "HOME": str(root)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    failed = {args: r["err"][-1500:] for args, r in results.items() if r["code"] not in (0, None)}
    assert not failed, failed
    return root


def _config(run: pathlib.Path) -> dict:
    return json.loads((run / "config.json").read_text())


@pytest.mark.slow  # the whole chain: ~8 minutes on 2 cores
def test_the_chain_branches_decays_averages_and_scores(chain):
    runs = chain / "runs"
    done = {name: json.loads((runs / name / "DONE").read_text())["step"]
            for name in ("mb_stable", "mb_ctx", "mb_decay_a", "mb_decay_b")}
    assert done == {"mb_stable": 200, "mb_ctx": 260, "mb_decay_a": 300, "mb_decay_b": 300}
    assert (runs / "mb_stable" / "checkpoints" / "100").is_dir()  # kept for good
    decay_a, decay_b = _config(runs / "mb_decay_a"), _config(runs / "mb_decay_b")
    assert [(pathlib.Path(e["workdir"]).name, e["step"]) for e in decay_a["lineage"]] == [("mb_stable", 200),
                                                                                          ("mb_ctx", 260)]
    assert decay_a["branch"]["data"] == "continued" and decay_b["branch"]["data"] == "reseeded"
    assert _config(runs / "mb_ctx")["branch"]["data"] == "reseeded"
    rates = [json.loads(line) for line in (runs / "mb_decay_a" / "metrics.jsonl").read_text().splitlines()]
    rates = {r["step"]: r["train/learning_rate"] for r in rates if "train/learning_rate" in r}
    assert rates[300] == 0.0
    scoreboard = (runs / "mb_soup" / "smoke" / "scoreboard.md").read_text()
    assert "mb_decay_a" in scoreboard and "mb_decay_b" in scoreboard  # the average's sources, on its scoreboard


@pytest.mark.slow  # reads three checkpoints and exports one: ~1 minute after the chain
def test_the_average_is_the_mean_and_the_context_extension_loads_in_transformers(chain, tmp_path):
    import transformers  # noqa: PLC0415

    from bert_jax.checkpoint.params import restore_params  # noqa: PLC0415
    from bert_jax.families import model_for  # noqa: PLC0415
    from bert_jax.storage.workdir import Workdir  # noqa: PLC0415

    runs = chain / "runs"
    a, _ = restore_params(Workdir(runs / "mb_decay_a"), model_for)
    b, _ = restore_params(Workdir(runs / "mb_decay_b"), model_for)
    soup, _ = restore_params(Workdir(runs / "mb_soup"), model_for)
    import jax  # noqa: PLC0415

    for x, y, m in zip(jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(soup)):
        np.testing.assert_allclose(m, (x.astype(np.float64) + y) / 2, rtol=0, atol=1e-7)
    out = tmp_path / "hf"
    subprocess.run([sys.executable, "-m", "bert_jax.export", f"--workdir={runs / 'mb_ctx'}", f"--out={out}"],
                   check=True, capture_output=True, cwd=chain, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    model = transformers.AutoModelForMaskedLM.from_pretrained(out)
    rope = model.config.rope_parameters  # transformers 5's form of global_rope_theta / local_rope_theta
    assert rope["full_attention"]["rope_theta"] == 160_000.0 and rope["sliding_attention"]["rope_theta"] == 10_000.0
    assert model.config.max_position_embeddings == 256
    ids = transformers.AutoTokenizer.from_pretrained(out)(["a sentence " * 100], return_tensors="pt")["input_ids"]
    assert ids.shape[1] > 128  # longer than the stable phase's length
    logits = model(input_ids=ids[:, :256]).logits
    assert np.isfinite(logits.detach().numpy()).all()
