"""Continued pre-training after extend-vocab: FVT-initialised new rows beat randomly initialised ones early.

The bench (bench/vocab_extension_learning.py) at a smaller scale: a micro BERT pre-trained on the embedded
Python documentation, extended with the legal words of the licences Debian ships, then continued on them
with the same steps and seed from each initialisation; held-out eval MLM loss in bits per character, at the
first eval (25 steps). Before any update the two are level (FVT 0.004 bits per character behind in the
bench: its new output rows, the mean of frequent pieces', draw probability in every context); FVT leads
from the first eval on.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from bench import vocab_extension_learning as bench

pytestmark = pytest.mark.slow
ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not bench.LICENCES.is_dir(), reason="the domain corpus comes from /usr/share/common-licenses")
def test_fvt_initialisation_beats_random_initialisation_early(tmp_path: pathlib.Path):
    # The bench's defaults, its runs stopped at the first eval (same schedule, so the figures of docs/results/guides.md's table).
    result = bench.compare(tmp_path, base_steps=2000, steps=150, eval_every=25, add=256, warmup=0,
                           runs=("fvt", "random"), step0=False, stop_at=25)
    fvt, random = result["curves"]["fvt"], result["curves"]["random"]
    print(bench.table(result))
    assert [p["step"] for p in fvt] == [p["step"] for p in random] == [25]
    assert fvt[0]["bpc"] < random[0]["bpc"]


def test_the_command_extends_a_workdir_and_refuses_an_existing_out(tmp_path: pathlib.Path):
    workdir, out = tmp_path / "run", tmp_path / "domain_hf"
    bench.train_and_evaluate(bench.micro_config(steps=2, eval_every=2), str(workdir))
    (tmp_path / "domain.txt").write_text("the hepatotoxicity of acetaminophen\nacetaminophen and ibuprofen\n" * 5)
    command = [sys.executable, "-m", "bert_jax.commands.extend_vocab", f"--from={workdir}",
               f"--corpus={tmp_path / 'domain.txt'}", "--add=2", f"--out={out}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    first = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    report = json.loads((out / "extend_vocab_report.json").read_text())
    assert [w["word"] for w in report["words"]] == ["acetaminophen", "hepatotoxicity"]
    assert json.loads((out / "config.json").read_text())["vocab_size"] == report["vocab_size"]
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode != 0 and "already exists; pass --overwrite" in again.stderr
    assert "Traceback" not in again.stderr

