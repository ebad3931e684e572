"""GLUE's dev sets, as the papers report them: 8 tasks, 5 seeds, the median per task.

    bert-jax evaluate --checkpoint=runs/bert_base --suite=glue --glue_dir=data/glue --out=runs/bert_base/glue

--glue_dir holds the official layout (download_glue_data.py): CoLA/, SST-2/, MRPC/, STS-B/, QQP/, MNLI/,
QNLI/, RTE/, each with train.tsv and dev.tsv (MNLI: dev_matched.tsv). With --tfds_data_dir instead, the
same tasks are read from TFDS's prepared `glue/*`. Recipe: BERT's (Devlin et al. 2019, §4.1 and A.3) —
3 epochs, batch 32, warmup 10 %, learning rate searched over {2e-5, 3e-5} per task (the best median
wins); RTE, MRPC and STS-B, small and unstable, take 10 epochs (as RoBERTa, Liu et al. 2019, Table 10).
`start_from_mnli=True` starts them from the MNLI fine-tuned encoder (RoBERTa's and ELECTRA's practice).
Expect hours per seed on one accelerator for the whole battery (MNLI and QQP dominate); --tasks picks some.
"""
from bert_jax.configs.suites.recipe import suite, task

NLI = "contradiction,entailment,neutral"


def get_config():
    c = suite("glue", seeds=5, start_from_mnli=False)
    c.tasks.mnli = task("classification", "MNLI", "sentence1,sentence2", "gold_label", "accuracy", labels=NLI,
                        dev="dev_matched.tsv", tfds="glue/mnli", tfds_fields="premise,hypothesis,label",
                        tfds_dev="validation_matched", tfds_labels="entailment,neutral,contradiction")
    c.tasks.qqp = task("classification", "QQP", "question1,question2", "is_duplicate", "accuracy", labels="0,1",
                       tfds="glue/qqp", tfds_fields="question1,question2,label")
    c.tasks.qnli = task("classification", "QNLI", "question,sentence", "label", "accuracy",
                        labels="entailment,not_entailment", tfds="glue/qnli", tfds_fields="question,sentence,label",
                        tfds_labels="entailment,not_entailment")
    c.tasks.sst2 = task("classification", "SST-2", "sentence", "label", "accuracy", labels="0,1",
                        tfds="glue/sst2", tfds_fields="sentence,label", max_seq_length=64)
    c.tasks.cola = task("classification", "CoLA", "sentence", "label", "matthews", labels="0,1",
                        columns="source,label,original_label,sentence", tfds="glue/cola",
                        tfds_fields="sentence,label", max_seq_length=64)
    c.tasks.stsb = task("regression", "STS-B", "sentence1,sentence2", "score", "spearman", tfds="glue/stsb",
                        tfds_fields="sentence1,sentence2,label", epochs=10, init_from_task="mnli")
    c.tasks.mrpc = task("classification", "MRPC", "#1 String,#2 String", "Quality", "f1", labels="0,1",
                        tfds="glue/mrpc", tfds_fields="sentence1,sentence2,label", epochs=10, init_from_task="mnli")
    c.tasks.rte = task("classification", "RTE", "sentence1,sentence2", "label", "accuracy",
                       labels="entailment,not_entailment", tfds="glue/rte", tfds_fields="sentence1,sentence2,label",
                       tfds_labels="entailment,not_entailment", epochs=10, init_from_task="mnli")
    return c
