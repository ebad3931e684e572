"""Acceptance "the in-loop probe costs, on the tiny config, less than 15 % of the run's wall-clock at its default
cadence": whole tiny pre-trainings with and without `eval.downstream_suite=smoke`, interleaved A/B/A/B.

    python -m bench.probe_cost --out=/tmp/probe_cost [--repeats=2] [--train=1000 --dev=200] [--num_steps=0]

The probe's data is a GLUE-layout directory made from bench/make_finetune_data.py's sentences: SST-2 (a sentence
as written against its words shuffled, label 1/0) and STS-B (a sentence against itself with k word pairs swapped,
score 5 - k). Each run is a fresh `python -m bert_jax.commands.pretrain --config=configs/tiny.py` process in its own
workdir (tokenizer training, compilation, 1000 steps, evals, checkpoints: all of it counted); B adds the smoke
suite at the default cadence (config.eval.downstream_every_steps=0: once, at the last step). Prints each run's
wall-clock, each pair's B/A - 1 and their median, the probe's own seconds in each B run (its log lines' timestamps)
against the rest of that run (the figure other processes' load shifts least), and the probe's scores;
OUT/summary.json holds them. Other processes on the machine shift both arms, which is why they alternate.
"""
import datetime
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

from absl import app, flags

from bench import make_finetune_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"


def swapped(sentence: str, pairs: int, rng: random.Random) -> str:
    """The sentence with `pairs` random pairs of its words swapped."""
    words = sentence.split()
    for _ in range(pairs):
        i, j = rng.randrange(len(words)), rng.randrange(len(words))
        words[i], words[j] = words[j], words[i]
    return " ".join(words)


def write_glue(glue: str, train: int, dev: int) -> None:
    """SST-2/{train,dev}.tsv and STS-B/{train,dev}.tsv in GLUE's layout, from the embedded corpus."""
    splits = make_finetune_data.make_splits(0, {"train": train, "validation": dev, "test": 0}, "shuffle")
    os.makedirs(os.path.join(glue, "SST-2"), exist_ok=True)
    os.makedirs(os.path.join(glue, "STS-B"), exist_ok=True)
    rng = random.Random(1)
    for split, name in (("train", "train"), ("validation", "dev")):
        rows = splits[split]
        with open(os.path.join(glue, "SST-2", f"{name}.tsv"), "w") as f:
            f.write("sentence\tlabel\n" + "".join(f"{s}\t{int(label == 'original')}\n" for s, label in rows))
        with open(os.path.join(glue, "STS-B", f"{name}.tsv"), "w") as f:
            f.write(STSB_HEADER)
            for i, (s, _) in enumerate(rows):
                k = rng.randrange(6)
                f.write(f"{i}\tmain-news\tx\t2012\t{i}\tnone\tnone\t{s}\t{swapped(s, k, rng)}\t{5 - k}\n")


def probe_seconds(log: str) -> float:
    """The probe's own wall-clock in a run's log: from its start line to its result line (absl's timestamps)."""
    stamps = [datetime.datetime.strptime(line.split()[1], "%H:%M:%S.%f") for line in log.splitlines()
              if "downstream probe at step" in line and line[:1] == "I"]
    return (stamps[-1] - stamps[0]).total_seconds() if len(stamps) >= 2 else 0.0


def pretrain(workdir: str, glue: str, probed: bool, num_steps: int) -> tuple[float, float]:
    """One whole tiny pre-training process: (its wall-clock, its probe's) in seconds."""
    shutil.rmtree(workdir, ignore_errors=True)
    argv = [sys.executable, "-m", "bert_jax.commands.pretrain", "--config=configs/tiny.py", f"--workdir={workdir}"]
    if num_steps:
        argv += [f"--config.train.num_steps={num_steps}"]
    if probed:
        argv += ["--config.eval.downstream_suite=smoke", f"--config.eval.downstream_data_dir={glue}"]
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return wall, probe_seconds(done.stderr)


def probe_rows(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if k == "step" or k.startswith("downstream/")} for r in rows
            if any(k.startswith("downstream/") for k in r)]


def _main(argv) -> None:
    del argv
    f = flags.FLAGS
    glue = os.path.join(f.out, "glue")
    write_glue(glue, f.train, f.dev)
    print(f"[probe_cost] uptime: {os.getloadavg()}", flush=True)
    walls, probes = {"plain": [], "probed": []}, []
    rows = []
    for repeat in range(f.repeats):
        for arm in ("plain", "probed"):  # A/B/A/B
            workdir = os.path.join(f.out, f"{arm}_{repeat}")
            wall, probe = pretrain(workdir, glue, arm == "probed", f.num_steps)
            walls[arm].append(wall)
            print(f"[probe_cost] repeat {repeat} {arm}: {wall:.1f} s"
                  f"{f', of which the probe {probe:.1f} s' if arm == 'probed' else ''} "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
            if arm == "probed":
                rows, _ = probe_rows(workdir), probes.append(probe)
    ratios = [b / a - 1 for a, b in zip(walls["plain"], walls["probed"])]
    shares = [p / (w - p) for p, w in zip(probes, walls["probed"])]  # the probe against the rest of its own run
    summary = {"walls_s": walls, "probe_s": probes, "overhead": ratios, "median_overhead": statistics.median(ratios),
               "in_run_overhead": shares, "probe_rows": rows, "train": f.train, "dev": f.dev,
               "num_steps": f.num_steps or "tiny's"}
    print(f"[probe_cost] whole runs, probed / plain - 1 per pair: {', '.join(f'{100 * r:.1f} %' for r in ratios)}; "
          f"median {100 * summary['median_overhead']:.1f} %", flush=True)
    print(f"[probe_cost] the probe's own time against the rest of its run: "
          f"{', '.join(f'{100 * r:.1f} %' for r in shares)}", flush=True)
    print(f"[probe_cost] probe rows: {rows}", flush=True)
    with open(os.path.join(f.out, "summary.json"), "w") as out:
        json.dump(summary, out, indent=2)


if __name__ == "__main__":
    flags.DEFINE_string("out", None, "Directory for the GLUE-layout data, the workdirs and summary.json.")
    flags.DEFINE_integer("repeats", 2, "A/B pairs.")
    flags.DEFINE_integer("train", 1000, "Training examples per probe task.")
    flags.DEFINE_integer("dev", 200, "Dev examples per probe task.")
    flags.DEFINE_integer("num_steps", 0, "Pre-training steps (0: configs/tiny.py's).")
    flags.mark_flags_as_required(["out"])
    sys.exit(app.run(_main))
