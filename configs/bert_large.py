"""BERT-large (Devlin et al. 2019): 24 layers, hidden 1024, 16 heads, MLP 4096, vocab 30522; ~335M params.

Both phases (seq 128 for 900k steps, then seq 512 to 1M) as one command, one schedule:

    bert-jax pretrain --config=configs/bert_large.py --workdir=gs://BUCKET/bert_large

The mesh is the run's, not a stage's: for a data-parallel phase 2 (see the mesh below), relaunch the
same command with --config.mesh.shape='(-1,1,1)' once phase 2 started (a mesh change passes the
resume check: it does not change the experiment).

Same recipe as BERT-base (batch 256, lr 1e-4, 1M steps); the larger model is usually
run with LAMB at batch 32k instead (You et al. 2020): `--config.train.optimizer=lamb
--config.train.global_batch_size=32768 --config.train.learning_rate=6e-3
--config.train.num_steps=7038 --config.train.warmup_steps=2000`.

Layers are rematerialised with `dots` (every matmul output kept, the rest recomputed): on one
H100 it was the policy that fit the paper's batch (seq 128, batch 256) and the fastest measured
(measured 2026-11-22). With the default fused attention (cudnn / splash) `dots` keeps no
[batch, heads, q, k] tensor, so seq 512 at batch 64 keeps as much as seq 128 at batch 256. With
attention dropout on (xla attention) `dots` also keeps the float32 attention logits: use
`--config.model.remat_policy=dots_no_batch` (or `full`) at seq 512 then.

The mesh is FSDP (parameters and optimizer state split over the chips; `--config.mesh.shape='(-1,1,1)'`
for data parallelism): with the state replicated, every chip runs the whole AdamW update, 9.2 GB of
HBM traffic per step. Planned for a v5e-16 at the paper's batch (`bert-jax plan
--config=configs/bert_large.py --tpu=v5e-16`, 2026-11-25): data parallel moves 30.0 GB per chip and
step, memory-bound at an MFU bound of 53.8 %; FSDP 9.2 GB, compute-bound, 97.4 %, and 1.9 GiB per
chip instead of 7.9 (collectives over ICI are not in that bound). At seq 512 data parallel is
compute-bound at 97.5 %, while FSDP was counted at 105 GB per chip and step against 57, memory-bound
at 65.1 % (not examined further), so phase 2 sets the data-parallel mesh. One device is the same
either way.
"""
from bert_jax.configs import base


def get_config():
    c = base.get_config()
    c.model.hidden_size = 1024
    c.model.num_layers = 24
    c.model.num_heads = 16
    c.model.intermediate_size = 4096
    c.model.remat_policy = "dots"
    c.mesh.shape = (1, -1, 1)  # FSDP: see the docstring
    c.train.num_steps = 1_000_000
    c.train.stages = (dict(start=900_000, data=dict(max_seq_length=512)),)  # phase 2: the last 10 % at seq 512
    c.checkpoint.every_steps = 5_000
    return c
