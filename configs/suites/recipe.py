"""What one task of a suite is (configs/suites/__init__.py): where its files are, its columns, metric,
learning-rate grid, and the whole fine-tuning config that runs it."""
import ml_collections

from bert_jax.configs.finetune import common


def suite(name: str, seeds: int, start_from_mnli: bool = False) -> ml_collections.ConfigDict:
    """An empty suite: add tasks as `c.tasks.<name> = task(...)`."""
    c = ml_collections.ConfigDict()
    c.name, c.seeds, c.start_from_mnli = name, seeds, start_from_mnli
    c.tasks = ml_collections.ConfigDict()
    return c


def task(kind: str, directory: str, text_fields: str, label_field: str, metric: str, *, labels: str = "",
         columns: str = "", train: str = "train.tsv", dev: str = "dev.tsv", tfds: str = "", tfds_fields: str = "",
         tfds_dev: str = "validation", tfds_labels: str = "", init_from_task: str = "",
         learning_rates=(2e-5, 3e-5), epochs: float = 3.0, batch_size: int = 32, warmup_fraction: float = 0.1,
         max_seq_length: int = 128, max_train_rows: int = 0, max_dev_rows: int = 0,
         sample_seed: int = 0, format: str = "tsv") -> ml_collections.ConfigDict:  # noqa: A002 (the key's name)
    """One task of a suite.

    directory/train/dev: the task's folder under --glue_dir and its files (GLUE's TSV layout; scored on dev).
    text_fields, label_field: the columns the task reads, as the file's header names them; `columns` names
      them all for a file without a header (CoLA).
    labels: the label set, in order ("" for regression); a label outside it fails.
    metric: the headline (accuracy, f1, matthews, pearson, spearman) that the scoreboard reports.
    tfds: the TFDS name to read instead when --tfds_data_dir is given (e.g. "glue/sst2"), its text and label
      fields (`tfds_fields`, label last), its dev split, and its label names by index (`tfds_labels`).
    init_from_task: start from this task's fine-tuned encoder (the suite's `start_from_mnli`).
    format: tsv (GLUE's layout) | squad (SQuAD JSON files, for span_qa: text_fields, label_field, labels unused).
    max_train_rows, max_dev_rows: use at most this many rows of each split (0: all), for a task that must stay short
      whatever the folder holds (the smoke suite, the pre-training probe): a sample of the whole file by
      `sample_seed`, stratified by label for a classification (OUT/data/<task>/sample.json records it).
    """
    t = ml_collections.ConfigDict()
    t.dir, t.train, t.dev, t.columns = directory, train, dev, columns
    t.text_fields, t.label_field, t.labels, t.metric = text_fields, label_field, labels, metric
    t.tfds, t.tfds_fields, t.tfds_dev, t.tfds_labels = tfds, tfds_fields, tfds_dev, tfds_labels
    t.init_from_task, t.format = init_from_task, format
    t.max_train_rows, t.max_dev_rows, t.sample_seed = max_train_rows, max_dev_rows, sample_seed
    t.learning_rates = tuple(float(lr) for lr in learning_rates)
    c = common.get_config(kind)
    c.train.epochs, c.train.batch_size, c.train.warmup_fraction = float(epochs), batch_size, warmup_fraction
    c.data.max_seq_length = max_seq_length
    c.logging.plots = False  # one plot per run would be hundreds of PNGs; the scoreboard draws its own
    t.finetune = c
    return t


def retrieval(pooling: str = "", max_seq_length: int = 0, query_prefix: str = "", document_prefix: str = "",
              batch_size: int = 64, chunk_size: int = 16384) -> ml_collections.ConfigDict:
    """A suite's zero-shot retrieval section (bert_jax/finetune/zero_shot.py): every BEIR-layout subfolder of
    --beir_dir, embedded with the checkpoint and searched exactly.

    pooling, max_seq_length, query_prefix, document_prefix: "" / 0 = the checkpoint's own (a sentence-transformers
      folder's pooling, length and prompts; a fine-tuned sentence-embedding run's pooling and length; else mean
      pooling and the model's longest input); set, they win.
    batch_size: texts per encoder call; chunk_size: documents embedded and searched at a time (bounds memory).
    finetune: a sentence-embedding fine-tuning config whose model (dtype, attention_impl), mesh and distributed
      keys run the encoder.
    """
    r = ml_collections.ConfigDict()
    r.pooling, r.max_seq_length = pooling, max_seq_length
    r.query_prefix, r.document_prefix = query_prefix, document_prefix
    r.batch_size, r.chunk_size = batch_size, chunk_size
    r.finetune = common.get_config("sentence_embedding")
    r.finetune.model.dropout_rate = 0.0
    return r
