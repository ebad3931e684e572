"""The sources read by index: the embedded corpus, TFDS datasets and prepared shards."""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Sequence

import ml_collections

import bert_jax
from bert_jax.registry import registered_as
from bert_jax.storage import paths
from bert_jax.storage.retry import retried
from data_pipelines.sources import corpus, prepared, readers
from data_pipelines.sources.readers import SkipStats
from data_pipelines.sources.source import SOURCES, TableSource


@registered_as(SOURCES, "embedded")
class EmbeddedSource(TableSource):
    """Python's own documentation (corpus.py): the corpus configs/tiny.py runs on with no download."""

    def table(self, stats: SkipStats | None = None) -> Sequence:
        return list(corpus.embedded_documents())

    def fingerprint(self) -> dict:
        digest = hashlib.sha256()
        for document in corpus.embedded_documents():
            digest.update(json.dumps(document).encode())
        return {"source": self.name, "python": platform.python_version(), "sha256": digest.hexdigest()}


@registered_as(SOURCES, "tfds")
class TfdsSource(TableSource):
    """`tfds.data_source(data.tfds_name, split=data.tfds_split, data_dir=...)`: TFDS datasets built as ArrayRecord,
    read without TensorFlow; feature `data.field`."""

    def check(self) -> list[str]:
        super().check()
        if not self.cfg.get("tfds_name", ""):
            raise bert_jax.UserError("config.data.tfds_name is empty; source 'tfds' needs a dataset name")
        return []

    def table(self, stats: SkipStats | None = None) -> Sequence:
        return TfdsDocuments(self.cfg, stats)

    def fingerprint(self) -> dict:
        # The dataset's name, split and folder (its version is part of the name).
        return {"source": self.name, **{k: self.cfg.get(k, "") for k in ("tfds_name", "tfds_split", "tfds_data_dir")}}


@registered_as(SOURCES, "prepared")
class PreparedSource(TableSource):
    """ArrayRecord shards written by `bert-jax prepare` (`data.path` is its output folder): documents already
    tokenized, with the tokenizer that made them beside the shards; random access only."""

    tokenized = True
    sharded = True
    more_documents = "prepare it again from a corpus of several documents"

    def check(self) -> list[str]:
        super().check()
        prepared.read_manifest(self.cfg.path)  # names config.data.path if it is not prepared
        prepared.check_shards(self.cfg.path)  # a missing or truncated shard, named before anything is written
        return []

    def table(self, stats: SkipStats | None = None) -> Sequence:
        return prepared.PreparedDocuments(self.cfg.path, self.cfg.get("shard_cache_bytes", 0))

    def documents(self, shard_index: int, shard_count: int, stats: SkipStats):
        raise ValueError(
            f"config.data.source={self.name!r} holds tokenized documents: read it with "
            "sources.open_random_access, not iter_documents")

    def fingerprint(self) -> dict:
        self.check()
        manifest = paths.path(self.cfg.path) / prepared.MANIFEST_FILE
        return {"source": self.name, "path": self.cfg.path, "manifest": str(manifest),
                "manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest()}

    def bundled_tokenizer(self) -> str:
        self.check()
        return str(paths.path(self.cfg.path) / "tokenizer")


class TfdsDocuments(Sequence):
    """A TFDS ArrayRecord data source as raw documents; bad items read as [] (and are counted)."""

    def __init__(self, data_cfg: ml_collections.ConfigDict, stats: SkipStats | None = None):
        import tensorflow_datasets as tfds  # noqa: PLC0415 (slow import; only this source needs it)

        self._field = data_cfg.get("field", "text")
        self._segmenter = data_cfg.get("segmenter", "line")
        self._max_bytes = data_cfg.get("max_line_bytes", 1_000_000)
        self._stats = SkipStats() if stats is None else stats
        data_dir = data_cfg.get("tfds_data_dir", "") or None
        try:  # a storage fault on the way (a bucket's timeout) is tried again, then raised with its cause
            self._source = retried(
                lambda: tfds.data_source(data_cfg.tfds_name, split=data_cfg.tfds_split, data_dir=data_dir),
                f"opening TFDS {data_cfg.tfds_name!r} split {data_cfg.tfds_split!r}")
        except ValueError as e:  # TFDS's refusal of a name or split it does not know (DatasetNotFoundError among them)
            raise FileNotFoundError(
                f"config.data.tfds_name={data_cfg.tfds_name!r} split={data_cfg.tfds_split!r} "
                f"(data_dir={data_dir!r}) cannot be opened as an ArrayRecord TFDS source: {e}"
            ) from e

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> list[str]:
        item = self._source[index]
        if self._field not in item:
            raise ValueError(
                f"config.data.field={self._field!r} is not a feature of the TFDS dataset; "
                f"features: {sorted(item)}"
            )
        text = readers.record_text(item[self._field], self._max_bytes, self._stats)
        return [] if text is None else readers.document_segments(text, self._segmenter, self._stats)
