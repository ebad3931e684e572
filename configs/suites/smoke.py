"""A smoke battery: two short GLUE-layout tasks (SST-2 classification, STS-B regression), 2 seeds, one
learning rate, a micro recipe, at most 1,000 train and 500 dev rows per task (a seeded sample of each file,
stratified by label, so real GLUE's 67k SST-2 rows stay short). It checks the pipeline end to end in minutes and
suits the pre-training probe (`--config.eval.downstream_suite=smoke`); its scores say little about a model.

    bert-jax evaluate --checkpoint=runs/tiny --suite=smoke --glue_dir=data/glue --out=runs/tiny/smoke
"""
from bert_jax.configs.suites.recipe import suite, task


def get_config():
    c = suite("smoke", seeds=2, start_from_mnli=False)
    recipe = dict(learning_rates=(1e-4,), epochs=2.0, batch_size=16, warmup_fraction=0.1, max_seq_length=32,
                  max_train_rows=1000, max_dev_rows=500)
    c.tasks.sst2 = task("classification", "SST-2", "sentence", "label", "accuracy", labels="0,1",
                        tfds="glue/sst2", tfds_fields="sentence,label", **recipe)
    c.tasks.stsb = task("regression", "STS-B", "sentence1,sentence2", "score", "spearman", tfds="glue/stsb",
                        tfds_fields="sentence1,sentence2,label", **recipe)
    for t in c.tasks.values():
        t.finetune.train.evals_per_run = 2  # the scoreboard reads the final validation; curves matter less here
        t.finetune.checkpoint.max_to_keep = 1
    return c
