"""What classification and regression share: one output vector per example, from the sequence head on [CLS]."""
import numpy as np

from bert_jax.finetune import data
from bert_jax.finetune.model import SequenceHead
from bert_jax.finetune.tasks.task import Task


class SequenceTask(Task):
    hf_class = "ForSequenceClassification"

    def featurize(self, task_cfg, data_cfg, fast, rows, names):
        out = data.encode_texts(fast, rows)
        out["labels"] = self.labels(rows, names)
        out["label_weights"] = np.ones(len(rows), np.float32)
        return out

    def labels(self, rows: list[dict], names: list[str]):
        raise NotImplementedError

    def build_head(self, family, model_cfg, task_cfg, num_outputs, has_family_pooler):
        return SequenceHead(num_outputs=num_outputs, pooling=task_cfg.pooling, has_family_pooler=has_family_pooler,
                            hidden_size=model_cfg.hidden_size, dropout_rate=float(model_cfg.dropout_rate),
                            initializer_range=float(model_cfg.get("initializer_range", 0.02)),
                            pooler_activation=family.hf.classifier_head.activation)

    def check_export(self, task_cfg):
        if task_cfg.pooling != "cls":
            raise ValueError("config.task.pooling=mean has no Hugging Face ForSequenceClassification counterpart "
                             "(they pool [CLS]); fine-tune with pooling=cls to export")
