"""The tokenizer a pre-training run tokenizes with, in DIR/tokenizer/: copied from the weights the run starts from
(config.init_from_hf, or a distillation teacher's), or trained per config.data.tokenizer; checked against the
model before any batch is built."""
from bert_jax.checkpoint import reference
from bert_jax.hf import folder as hf_folder
from bert_jax.run import harness
from bert_jax.storage.workdir import Workdir
from bert_jax.train import branch
from bert_jax.train import teacher as teacher_lib
from data_pipelines.tokenizers import tokenizer as tokenizer_lib


def prepare_run_tokenizer(config, workdir: str, teacher: teacher_lib.Teacher | None):
    """Process 0 copies or trains it, the others read it after a barrier; fails naming the key where the
    weights have no tokenizer, or the tokenizer disagrees with config.model or the teacher."""
    tokenizer_dir = str(Workdir(workdir).tokenizer)
    init_from_hf = config.init_from_hf  # an HF folder: checked with the config (config_validation.check_inputs)
    # A fresh run starting from HF weights (or taught by a teacher) uses the tokenizer those weights knew.
    # A branch tokenizes as its parent did (bert_jax/train/branch.py), a grown model as the run it grew from.
    weights_key, weights_tokenizer = (("config.init_from_hf", init_from_hf) if init_from_hf else
                                      ("config.branch_from", branch.tokenizer_dir(config)) if config.branch_from else
                                      ("config.grow_from", _source_tokenizer(config.grow_from)) if config.get(
                                          "grow_from", "") else
                                      ("config.distill.teacher", teacher.tokenizer_dir) if teacher else ("", ""))
    if teacher is not None and config.data.tokenizer.path:
        weights_tokenizer = ""  # the configured tokenizer stays; check_vocabulary below compares it

    def write_tokenizer():  # copied or trained
        if weights_tokenizer and not tokenizer_lib.has_tokenizer(tokenizer_dir):
            hf_folder.copy_tokenizer_files(weights_tokenizer, tokenizer_dir)
            if not tokenizer_lib.has_tokenizer(tokenizer_dir):
                raise ValueError(f"{weights_key}={weights_tokenizer!r} has no tokenizer (vocab.txt, tokenizer.json "
                                 f"or spiece.model) to tokenize with")
        return tokenizer_lib.prepare_tokenizer(config.data, tokenizer_dir)

    tokenizer = harness.written_by_process_0("tokenizer_written", write_tokenizer,
                                             lambda: tokenizer_lib.prepare_tokenizer(config.data, tokenizer_dir))
    if teacher is not None:
        teacher_lib.check_vocabulary(teacher, tokenizer, tokenizer_dir)
    _check_model_fits(config, tokenizer, workdir)
    return tokenizer


def _source_tokenizer(grow_from: str) -> str:
    """DIR/tokenizer of config.grow_from's DIR:STEP (resolved with the config, and not again: a resume reads none)."""
    return str(Workdir(reference.split(grow_from)[0]).tokenizer)


def _check_model_fits(config, tokenizer, workdir: str) -> None:
    # A model that reads pad_token_id (e.g. to offset positions) must agree with the tokenizer.
    pad_token_id = config.model.get("pad_token_id")
    if pad_token_id is not None and pad_token_id != tokenizer_lib.special_ids(tokenizer).pad:
        raise ValueError(
            f"config.model.pad_token_id={pad_token_id} but the tokenizer in {workdir}/tokenizer pads with id "
            f"{tokenizer_lib.special_ids(tokenizer).pad}; set --config.model.pad_token_id to that id"
        )
    if tokenizer.get_vocab_size() > config.model.vocab_size:
        raise ValueError(
            f"the tokenizer in {workdir}/tokenizer has {tokenizer.get_vocab_size()} tokens, more than "
            f"config.model.vocab_size={config.model.vocab_size}"
        )
