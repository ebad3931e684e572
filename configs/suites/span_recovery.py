"""Span recovery: one extractive-QA task (the `span_qa` kind, SQuAD JSON) made from the embedded corpus, 3 seeds, for
tiny pre-training runs: docs/results/spanbert.md compares SpanBERT's masking and boundary objective with it.

    python bench/span_qa_study.py --out=runs/span_qa_study        # makes the data, pre-trains, then runs:
    bert-jax evaluate --checkpoint=RUN --suite=configs/suites/span_recovery.py --glue_dir=DATA --out=RUN/span_qa

DATA/SPAN-RECOVERY/{train,dev}.json come from bench/span_qa_study.py's `write_span_recovery`: a context of two
sentences of the corpus; a question of the three words either side of a 1-3 word span of the first, "left ? right";
the answer that span. Windows of 64 tokens (the tiny runs' positions) overlap by 16. Its F1 (the official SQuAD script's) is the scoreboard's median.
"""
from bert_jax.configs.suites.recipe import suite, task


def get_config():
    c = suite("span_recovery", seeds=3)
    c.tasks.span_recovery = task("span_qa", "SPAN-RECOVERY", "", "", "f1", train="train.json", dev="dev.json",
                                 format="squad", learning_rates=(1e-3,), epochs=3.0, batch_size=16, warmup_fraction=0.1,
                                 max_seq_length=64)
    t = c.tasks.span_recovery.finetune
    t.data.doc_stride = 16
    t.task.max_answer_length = 8
    t.train.evals_per_run = 1
    t.checkpoint.max_to_keep = 1
    return c
