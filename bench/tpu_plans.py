"""Every family's paper-scale config planned by the TPU compiler for real TPU slices, from this host.

    python -m bench.tpu_plans                         # every row below (hours of compiling on 2 cores)
    python -m bench.tpu_plans --rows=bert_large_128 --slices=v5e-16 --search
    python -m bench.tpu_plans --out=tpu_plans.jsonl   # one JSON object per row, as they finish
    python -m bench.tpu_plans --jobs=2                # two plans at a time (a TPU compile uses one core)
    python -m bench.tpu_plans --todo=albert_xxlarge@v5e-16,deberta_v3_large@v4-32 --search --search_only

Each row keeps the config's global batch (the paper's) and reaches it by gradient accumulation
over a per-chip micro-batch of --tokens_per_chip tokens (64 x 128, 16 x 512, 1 x 8192); it prints
the peak per chip against the HBM, the roofline tokens/s per chip and MFU bound
(bert_jax/plan/roofline.py, on HBM bytes: bert_jax/plan/hlo_traffic.py), and with --search the best configuration `plan --search` finds,
among scanned layers only unless --search_unrolled (an unrolled 24-layer step compiles in 10-20 min on 2 cores, a
scanned one in 1-2). Each plan runs in its own process (libtpu starts there).
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

from bert_jax.plan import plan_search

ROWS = {  # name: (config module, overrides)
    "bert_large_128": ("bert_jax.configs.bert_large", {}),
    "bert_large_512": ("bert_jax.configs.bert_large", {"data.max_seq_length": 512, "data.max_predictions_per_seq": 80,
                                                       "mesh.shape": (-1, 1, 1)}),  # phase 2 as its docstring runs it
    "roberta_large": ("bert_jax.configs.roberta_large", {}),
    "albert_xxlarge": ("bert_jax.configs.albert_xxlarge", {}),
    "electra_large": ("bert_jax.configs.electra_large", {}),
    "deberta_v3_large": ("bert_jax.configs.deberta_v3_large", {}),
    "modernbert_large_8192": ("bert_jax.configs.modernbert_large", {"data.max_seq_length": 8192,
                                                                    "model.max_position_embeddings": 8192}),
}
SLICES = ("v4-32", "v5e-16", "v5p-32")

ONE_ROW = """
import json, sys
from bert_jax.plan import compiled_plan as plan, plan_search
from bert_jax.parallel import tpu_slices
import importlib
name, module, overrides, tpu, tokens, search, scans, meshes, remats, enough_mfu, plan_too = json.loads(sys.argv[1])
c = plan_search.with_overrides(importlib.import_module(module).get_config(), overrides)
s = tpu_slices.parse_slice(tpu)
# The fewest accumulation steps that bring one chip's micro-batch down to `tokens` tokens.
steps = plan_search.accumulation_steps(c, s, plan_search.mesh_name(c))
shards = s.total_chips // c.mesh.shape[2]
c.train.grad_accum_steps = next((k for k in steps if c.train.global_batch_size // (shards * k) * c.data.max_seq_length
                                 <= tokens), steps[-1])
row = dict(row=name, tpu=tpu, global_batch=c.train.global_batch_size, seq=c.data.max_seq_length,
           micro_batch_per_chip=c.train.global_batch_size // c.train.grad_accum_steps // shards,
           grad_accum_steps=c.train.grad_accum_steps, remat=c.model.remat_policy, scan=c.model.scan_layers,
           hbm_gib=s.chip.hbm_gib)
try:
    if not plan_too:
        raise LookupError
    p = plan.make_plan(c, s)
    r = p.roofline
    row.update(kernel=p.kernel, fits=plan.fits(p)[0], peak_gib=p.peak_bytes / 2**30, tokens_per_s_per_chip=r.tokens_per_s,
               mfu_bound=r.mfu, bound=r.bound, hbm_gb_per_step=r.bytes / 1e9, compiler_gb_per_step=p.bytes_accessed / 1e9,
               kb_per_token=r.bytes_per_token / 1e3, flops_vs_formula=r.flops / r.formula_flops, compile_s=p.compile_s,
               layers_counted=p.layers_counted, compute_ms=r.compute_s * 1e3, memory_ms=r.memory_s * 1e3,
               links_ms={t.name: [t.overlapped_s * 1e3, t.serial_s * 1e3] for t in r.links},  # [async, sync]
               sent_gb={"within": sum(x.within_bytes for x in p.collectives) / 1e9,
                        "between": sum(x.between_bytes for x in p.collectives) / 1e9})
except plan.DoesNotFit as e:  # refused by the compiler: no memory analysis, only what it needs for temporaries
    row.update(fits=False, refused=str(e), needed_gib=e.needed_gib)
except LookupError:  # --search_only
    pass
if search:
    tried = plan_search.search(c, s, scans=tuple(scans), meshes=tuple(meshes), remats=tuple(remats),
                               enough_mfu=enough_mfu, log=lambda line: print(line, file=sys.stderr, flush=True))
    best = next((t for t in tried if t.fits), None)
    row.update(search_tried=len(tried), search_fit=sum(t.fits for t in tried), search_s=sum(t.plan.compile_s for t in tried
               if t.plan), search_space=dict(scans=scans, meshes=meshes, remats=remats, enough_mfu=enough_mfu))
    if best:
        b, r = best.candidate, best.plan.roofline
        row.update(search_best=b.flags(), search_mesh=b.mesh, search_remat=b.remat, search_scan=b.scan,
                   search_micro_batch=best.plan.micro_batch_per_chip, search_accum=b.grad_accum_steps,
                   search_peak_gib=best.plan.peak_bytes / 2**30, search_mfu_bound=r.mfu,
                   search_tokens_per_s_per_chip=r.tokens_per_s, search_bound=r.bound)
print("ROW " + json.dumps(row))
"""


def run_row(name: str, tpu: str, tokens: int, search: bool, scans: tuple[bool, ...] = (True,),
            meshes: tuple[str, ...] = plan_search.MESHES, remats: tuple[str, ...] = plan_search.REMATS,
            enough_mfu: float = 0.0, plan_too: bool = True, log_dir: str = "") -> dict:
    """One row, planned in its own process; its log (the search's candidates, as they compile) goes to
    log_dir/<row>@<slice>.log when given."""
    module, overrides = ROWS[name]
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_SKIP_MDS_QUERY="1")
    start = time.perf_counter()
    log_path = os.path.join(log_dir, f"{name}@{tpu}.log") if log_dir else os.devnull
    with tempfile.TemporaryFile("w+") as err, open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", ONE_ROW, json.dumps([name, module, overrides, tpu, tokens, search,
                                                                          scans, meshes, remats, enough_mfu,
                                                                          plan_too])],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=os.path.dirname(os.path.dirname(__file__)) or ".")
        for text in proc.stderr:  # as it comes, so a long search can be followed
            err.write(text)
            log.write(text)
            log.flush()
        stdout = proc.stdout.read()
        proc.wait()
        err.seek(0)
        stderr = err.read()
    line = next((x for x in stdout.splitlines() if x.startswith("ROW ")), None)
    if line is None:
        error = (stderr.strip().splitlines() or ["no output"])[-1]
        return dict(row=name, tpu=tpu, error=error[:300], wall_s=time.perf_counter() - start)
    return dict(json.loads(line[4:]), wall_s=time.perf_counter() - start)


def markdown(row: dict) -> str:
    if "error" in row:
        return f"| {row['row']} | {row['tpu']} | failed: {row['error']} | | | | | |"
    batch = (f"{row['global_batch']} x {row['seq']} ({row['micro_batch_per_chip']} per chip x {row['grad_accum_steps']}), "
             f"remat {row['remat']}")
    if "search_best" in row:
        search = (f"{row['search_mesh']}, remat {row['search_remat']}, {row['search_micro_batch']} per chip x "
                  f"{row['search_accum']}{'' if row['search_scan'] else ', unrolled'}: {row['search_peak_gib']:.1f} GiB, "
                  f"{row['search_tokens_per_s_per_chip']:,.0f} tok/s, MFU <= {row['search_mfu_bound']:.1%}")
        enough = row.get("search_space", {}).get("enough_mfu", 0)
        search += f" (stopped there: >= {enough:.0%})" if enough and row["search_mfu_bound"] >= enough else ""
    else:
        search = "nothing tried fits" if "search_tried" in row else "not run"
    if "fits" not in row:  # --search_only
        return f"| {row['row']} | {row['tpu']} | {batch} | | | | {search} | {row['search_s']:.0f} s |"
    if "refused" in row:
        return (f"| {row['row']} | {row['tpu']} | {batch} | **does not fit**: temporaries alone {row['needed_gib']:.1f} / "
                f"{row['hbm_gib']:g} GiB | | | {search} | |")
    fit = "fits" if row["fits"] else "**does not fit**"
    return (f"| {row['row']} | {row['tpu']} | {batch} | {fit}, {row['peak_gib']:.1f} / {row['hbm_gib']:g} GiB | "
            f"{row['tokens_per_s_per_chip']:,.0f} | {row['mfu_bound']:.1%} ({row['bound']}, {row['kb_per_token']:.0f} HBM "
            f"kB/token) | {search} | {row['compile_s']:.0f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from {', '.join(ROWS)}")
    parser.add_argument("--slices", default=",".join(SLICES))
    parser.add_argument("--tokens_per_chip", type=int, default=8192, help="tokens in one micro-batch on one chip")
    parser.add_argument("--search", action="store_true", help="also run plan --search per row (many compiles)")
    parser.add_argument("--search_unrolled", action="store_true", help="--search tries scan_layers=False too")
    parser.add_argument("--search_slices", default="", help="--search only on these slices (default: every one)")
    parser.add_argument("--search_only", action="store_true", help="--search without the config's own plan")
    parser.add_argument("--todo", default="", help="row@slice,... in this order, instead of --rows x --slices")
    parser.add_argument("--search_meshes", default=",".join(plan_search.MESHES))
    parser.add_argument("--search_remats", default=",".join(plan_search.REMATS))
    parser.add_argument("--search_enough_mfu", type=float, default=0.98,
                        help="a row's search stops at the first fit with this MFU bound; 0 = every configuration")
    parser.add_argument("--jobs", type=int, default=1, help="plans compiled at once (each in its own process)")
    parser.add_argument("--out", default="", help="append each row as JSON to this file")
    parser.add_argument("--log_dir", default="", help="each row's log, as it compiles, in <row>@<slice>.log here")
    args = parser.parse_args()
    scans = (True, False) if args.search_unrolled else (True,)
    print("| config | slice | global batch (per chip x accumulation) | fits, peak / HBM per chip | roofline tok/s per chip "
          "| MFU bound | best --search | compile |")
    print("|---|---|---|---|---|---|---|---|")
    todo = ([tuple(job.split("@")) for job in args.todo.split(",")] if args.todo else
            [(name, tpu) for name in args.rows.split(",") for tpu in args.slices.split(",")])
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:  # threads wait on the plans' processes
        searched = set(args.search_slices.split(",")) if args.search_slices else set(args.slices.split(","))
        meshes, remats = tuple(args.search_meshes.split(",")), tuple(args.search_remats.split(","))
        for row in pool.map(lambda job: run_row(*job, args.tokens_per_chip, args.search and job[1] in searched, scans,
                                                meshes, remats, args.search_enough_mfu, not args.search_only,
                                                args.log_dir), todo):
            print(markdown(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
