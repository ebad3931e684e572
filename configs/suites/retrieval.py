"""Zero-shot retrieval, as ModernBERT, NeoBERT and Ettin report it: every BEIR-layout dataset under --beir_dir
(one per subfolder: corpus.jsonl, queries.jsonl, qrels/test.tsv), embedded with the checkpoint and searched
exactly; nDCG@10 is each dataset's score (Recall@100 and MRR@10 beside it). No training, no seeds.

    bert-jax evaluate --checkpoint=runs/sbert --suite=retrieval --beir_dir=data/beir --out=runs/sbert/beir

The checkpoint embeds as it was trained to (see configs/suites/recipe.py's `retrieval`); override with
e.g. `--suite=configs/suites/retrieval.py` edited, or a suite file of your own. Expect minutes per 100k
documents on one accelerator (SciFact's 5k in seconds).
"""
from bert_jax.configs.suites.recipe import retrieval, suite


def get_config():
    c = suite("retrieval", seeds=1)
    c.retrieval = retrieval()
    return c
