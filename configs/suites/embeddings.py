"""Sentence embeddings judged two ways at once: STS-B (fine-tuned as a sentence-embedding model with the cosine
loss, Spearman of cosine similarity with the gold score, median over 3 seeds) and zero-shot retrieval over
--beir_dir's BEIR-layout datasets (nDCG@10, one run each).

    bert-jax evaluate --checkpoint=runs/sbert --suite=embeddings --glue_dir=data/glue --beir_dir=data/beir \
        --out=runs/sbert/embeddings

--glue_dir needs only STS-B/ (train.tsv, dev.tsv); --tasks=stsb or --tasks=<a dataset> runs one side.
"""
from bert_jax.configs.suites.recipe import retrieval, suite, task


def get_config():
    c = suite("embeddings", seeds=3)
    c.tasks.stsb = task("sentence_embedding", "STS-B", "sentence1,sentence2", "score", "spearman",
                        tfds="glue/stsb", tfds_fields="sentence1,sentence2,label", epochs=4,
                        learning_rates=(2e-5,), batch_size=16)
    c.tasks.stsb.finetune.task.update(embedding_loss="cosine", score_field="label", pooling="mean")
    c.retrieval = retrieval()
    return c
