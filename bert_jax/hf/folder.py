"""Reading and writing Hugging Face model folders: config.json, safetensors weights, tokenizer files.

Family-agnostic: the tensor names come from the family's converter (`HfConverter.to_hf` / `from_hf`,
bert_jax/hf/converter.py); this file only moves them to and from disk.
Weights are written with safetensors' numpy API, so exporting needs no torch. A folder may
be local or in a bucket (gs://, s3://): every file is read and written whole through
bert_jax.storage.paths.
"""
import io
import json

import numpy as np
from absl import logging
from safetensors.numpy import load, save

from bert_jax.storage import paths
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

SAFETENSORS_FILE = "model.safetensors"
TORCH_FILE = "pytorch_model.bin"
# What a tokenizer folder may hold (bert_jax.commands.tokenizer saves these): WordPiece vocab.txt,
# byte-level BPE vocab.json + merges.txt, SentencePiece spiece.model (spm.model in DeBERTa folders), any
# kind's tokenizer.json, and the tokenizer_config.json naming the transformers class and the special tokens.
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "vocab.json", "merges.txt", "spiece.model", "spm.model",
                   "tokenizer_config.json", "special_tokens_map.json")
TOKENIZER_CONFIG = "tokenizer_config.json"
# The names transformers' SentencePiece-backed tokenizer classes read the model under: ALBERT's and
# T5's spiece.model (what data_pipelines saves), DeBERTa-v2/v3's spm.model.
SENTENCEPIECE_FILE, SENTENCEPIECE_ALIASES = "spiece.model", ("spm.model",)
SPECIAL_TOKEN_KEYS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "bos_token", "eos_token")
# config.json's special-token ids, and the tokenizer's token each one is. A family's converter writes its usual
# vocabulary's ids (RoBERTa's byte-level BPE: <s>=0, <pad>=1, </s>=2); a run trained with another vocabulary (a
# RoBERTa on WordPiece, where 0 and 2 are [PAD] and [CLS]) must carry that vocabulary's own.
SPECIAL_ID_KEYS = {"pad_token_id": "pad", "bos_token_id": "cls", "eos_token_id": "sep", "cls_token_id": "cls",
                   "sep_token_id": "sep"}


def with_tokenizer_ids(hf_cfg: dict, tokenizer_dir: str) -> dict:
    """`hf_cfg` with each special-token id it names (SPECIAL_ID_KEYS, where not None) taken from the tokenizer."""
    ids = tokenizer_lib.special_ids(tokenizer_lib.load_tokenizer(tokenizer_dir))
    return {**hf_cfg, **{key: getattr(ids, token) for key, token in SPECIAL_ID_KEYS.items()
                         if hf_cfg.get(key) is not None}}


def _wordpiece_tokenizer_config() -> dict:
    # A tokenizer folder with only vocab.txt (older runs): uncased WordPiece with BERT's specials.
    return {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": True,
        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
        "mask_token": "[MASK]",
        "model_max_length": 512,
    }


def write_hf_folder(out_dir: str, state: dict[str, np.ndarray], hf_cfg: dict, tokenizer_dir: str | None,
                    model_max_length: int | None = None) -> None:
    """Writes config.json (its special-token ids the tokenizer's), model.safetensors (float32) and, from
    `tokenizer_dir`, the tokenizer files.

    The tokenizer's own tokenizer_config.json (its transformers class and special tokens)
    goes along, with `model_max_length` (default: the model's max_position_embeddings). A family
    whose transformers tokenizer reads a SentencePiece model (DeBERTa-v3) names that class as
    config.json's `tokenizer_class`: it then replaces the class a SentencePiece tokenizer saved, and
    the model is written under every name such classes read.
    """
    out = paths.path(out_dir)
    if tokenizer_dir is not None:
        hf_cfg = with_tokenizer_ids(hf_cfg, tokenizer_dir)
    paths.write_atomically(out / "config.json", json.dumps(hf_cfg, indent=2, sort_keys=True))
    tensors = {name: np.ascontiguousarray(array, dtype=np.float32) for name, array in state.items()}
    paths.write_atomically(out / SAFETENSORS_FILE, save(tensors, metadata={"format": "pt"}))
    if tokenizer_dir is None:
        return
    copied = copy_tokenizer_files(tokenizer_dir, out_dir)
    if TOKENIZER_CONFIG in copied:
        tok_cfg = json.loads((out / TOKENIZER_CONFIG).read_text())
    elif "vocab.txt" in copied:
        tok_cfg = _wordpiece_tokenizer_config()
    else:
        raise ValueError(f"{tokenizer_dir} holds no tokenizer the exported folder can use: expected "
                         f"{TOKENIZER_CONFIG} with the tokenizer's files, or a WordPiece vocab.txt")
    if SENTENCEPIECE_FILE in copied and "tokenizer_class" in hf_cfg:
        tok_cfg["tokenizer_class"] = hf_cfg["tokenizer_class"]
        for alias in SENTENCEPIECE_ALIASES:
            paths.copy_file(out / SENTENCEPIECE_FILE, out / alias)
    model_max = model_max_length or hf_cfg.get("max_position_embeddings")
    if model_max:
        tok_cfg["model_max_length"] = model_max
    paths.write_atomically(out / TOKENIZER_CONFIG, json.dumps(tok_cfg, indent=2))
    specials = {k: tok_cfg[k] for k in SPECIAL_TOKEN_KEYS if k in tok_cfg}
    paths.write_atomically(out / "special_tokens_map.json", json.dumps(specials, indent=2))


def copy_tokenizer_files(src_dir: str, dst_dir: str) -> list[str]:
    """Copies the TOKENIZER_FILES present in src_dir; returns the names copied."""
    src, dst = paths.path(src_dir), paths.path(dst_dir)
    copied = [name for name in TOKENIZER_FILES if (src / name).exists()]
    for name in copied:
        paths.copy_file(src / name, dst / name)
    return copied


def read_hf_config(hf_dir: str) -> dict:
    path = paths.path(hf_dir) / "config.json"
    if not path.exists():
        raise ValueError(f"{hf_dir} is not a Hugging Face model folder: it has no config.json")
    return json.loads(path.read_text())


def read_hf_state(hf_dir: str) -> dict[str, np.ndarray]:
    """The folder's weights as numpy arrays, from model.safetensors (or pytorch_model.bin, which needs torch)."""
    safetensors_path = paths.path(hf_dir) / SAFETENSORS_FILE
    if safetensors_path.exists():
        return load(safetensors_path.read_bytes())
    torch_path = paths.path(hf_dir) / TORCH_FILE
    if torch_path.exists():
        try:
            import torch  # optional (the `test` extra): only a pytorch_model.bin needs it
        except ImportError as e:
            raise ValueError(f"{torch_path} is a torch pickle and needs torch installed; or convert it to "
                             f"{SAFETENSORS_FILE}") from e
        state = torch.load(io.BytesIO(torch_path.read_bytes()), map_location="cpu", weights_only=True)
        return {name: tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
                for name, tensor in state.items()}
    raise ValueError(f"{hf_dir} holds neither {SAFETENSORS_FILE} nor {TORCH_FILE} (sharded checkpoints are "
                     f"not supported)")


def import_params(family, model_cfg, hf_dir: str, fallback_params: dict) -> dict:
    """Params for `family` from the HF folder `hf_dir`; tensors it lacks that the family may keep
    (e.g. pre-training heads of a BertModel-only checkpoint) come from `fallback_params`, and are logged."""
    if family.hf is None:
        raise ValueError(f"config.init_from_hf={hf_dir!r} is set, but config.model.family={family.name!r} "
                         f"has no Hugging Face import")
    extras = {}
    for name in family.hf.subfolders:  # e.g. ELECTRA's generator, exported beside the discriminator
        sub = str(paths.path(hf_dir) / name)
        if (paths.path(sub) / "config.json").exists():
            extras[name] = (read_hf_state(sub), read_hf_config(sub))
    kwargs = {"extras": extras} if family.hf.subfolders else {}
    params, report = family.hf.from_hf(read_hf_state(hf_dir), read_hf_config(hf_dir), model_cfg, fallback_params,
                                       **kwargs)
    logging.info("initialised params from the Hugging Face checkpoint %s%s", hf_dir,
                 f" (with its {', '.join(extras)} folder)" if extras else "")
    if report.kept_from_fallback:
        logging.info("it lacks %d tensor(s), kept freshly initialised: %s",
                     len(report.kept_from_fallback), ", ".join(report.kept_from_fallback))
    if report.unused:
        logging.info("its tensor(s) not used: %s", ", ".join(report.unused))
    return params
