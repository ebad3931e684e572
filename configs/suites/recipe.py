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
         max_seq_length: int = 128, max_train_rows: int = 0, max_dev_rows: int = 0) -> ml_collections.ConfigDict:
    """One task of a suite.

    directory/train/dev: the task's folder under --glue_dir and its files (GLUE's TSV layout; scored on dev).
    text_fields, label_field: the columns the task reads, as the file's header names them; `columns` names
      them all for a file without a header (CoLA).
    labels: the label set, in order ("" for regression); a label outside it fails.
    metric: the headline (accuracy, f1, matthews, pearson, spearman) that the scoreboard reports.
    tfds: the TFDS name to read instead when --tfds_data_dir is given (e.g. "glue/sst2"), its text and label
      fields (`tfds_fields`, label last), its dev split, and its label names by index (`tfds_labels`).
    init_from_task: start from this task's fine-tuned encoder (the suite's `start_from_mnli`).
    max_train_rows, max_dev_rows: use only the first rows of each split (0: all), for a task that must stay short
      whatever the folder holds (the smoke suite, the pre-training probe).
    """
    t = ml_collections.ConfigDict()
    t.dir, t.train, t.dev, t.columns = directory, train, dev, columns
    t.text_fields, t.label_field, t.labels, t.metric = text_fields, label_field, labels, metric
    t.tfds, t.tfds_fields, t.tfds_dev, t.tfds_labels = tfds, tfds_fields, tfds_dev, tfds_labels
    t.init_from_task = init_from_task
    t.max_train_rows, t.max_dev_rows = max_train_rows, max_dev_rows
    t.learning_rates = tuple(float(lr) for lr in learning_rates)
    c = common.get_config(kind)
    c.train.epochs, c.train.batch_size, c.train.warmup_fraction = float(epochs), batch_size, warmup_fraction
    c.data.max_seq_length = max_seq_length
    c.logging.plots = False  # one plot per run would be hundreds of PNGs; the scoreboard draws its own
    t.finetune = c
    return t
