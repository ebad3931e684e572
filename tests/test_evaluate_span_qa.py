"""`bert-jax evaluate` on a SQuAD-format task (span_qa, tasks.<task>.format="squad"): the battery reads the SQuAD
JSON with the task's own reader, writes its rows to OUT/data as JSONL, and a run reads them back unchanged. No
training: the fine-tuning itself is span_qa's (tests/test_finetune.py); the study that uses this is
bench/span_qa_study.py."""
import collections

from finetune_data import write_squad

from bert_jax.configs.suites import span_recovery
from bert_jax.finetune import battery, squad
from bert_jax.finetune.tasks import get_task


def test_a_squad_task_goes_through_out_data_unchanged(tmp_path):
    folder = tmp_path / "glue" / "SPAN-RECOVERY"
    folder.mkdir(parents=True)
    write_squad(folder / "train.json", 12, seed=0)
    write_squad(folder / "dev.json", 6, seed=1)
    suite = span_recovery.get_config()
    data = battery.read_task(suite, "span_recovery", str(tmp_path / "glue"))
    assert data.train == squad.read_squad(str(folder / "train.json"))[0]
    assert data.samples["train"]["kept"] == len(data.train) and not data.samples["train"]["stratified_by_label"]
    battery.write_data(str(tmp_path / "out"), {"span_recovery": data})
    files = battery.data_files(str(tmp_path / "out"), "span_recovery")
    run = battery.run_config(suite, battery.Run("span_recovery", 1e-3, 0, ""), files, "unused")
    assert (run.data.format, run.data.validation) == ("jsonl", files["dev"])
    task = get_task(run.task.kind)
    again, skipped = task.read(run.data, run.task, "dev", files["dev"])
    assert again == data.dev and not skipped
    # A run's reader and the battery's check read a row the same way.
    assert task.parse(run.task, data.dev[0], "dev", collections.Counter()) == data.dev[0]
