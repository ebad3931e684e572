"""SentencePiece, ALBERT's tokenizer: a unigram model (`config.data.tokenizer.kind=unigram`) or a BPE one
(`sentencepiece_bpe`); <pad> <unk> [CLS] [SEP] [MASK] are ids 0..4 and `▁` marks a word start. Saved as
spiece.model (AlbertTokenizer reads it as unigram); a BPE model also as tokenizer.json, which the generic
fast class reads."""
from __future__ import annotations

import io
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm
import tokenizers
from sentencepiece import sentencepiece_model_pb2
from tokenizers import models, normalizers, pre_tokenizers

from bert_jax.storage import paths
from data_pipelines.tokenizers.kinds import (SENTENCEPIECE_FILE, TOKENIZER_FILE, SpecialTokens, Tokenizer,
                                             TokenizerKind, add_pair_template, get_kind, register_kind)

SENTENCEPIECE_SPECIALS = SpecialTokens("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")
# SentencePiece skips sentences longer than this (its own default is 4192 bytes).
_MAX_SENTENCE_BYTES = 16_384
# SentencePiece's result depends on its thread count (per-thread float sums), so it is fixed
# here rather than taken from the machine; 16 threads on 2 cores cost nothing measurable.
_SENTENCEPIECE_THREADS = 16
_SENTENCEPIECE_SEED = 0
# A new word's piece: `▁word`, the form SentencePiece gives a word that starts after a space.
SENTENCEPIECE_SPACE = "▁"


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (unigram or BPE), held as its serialized proto."""

    def __init__(self, kind: str, model_proto: bytes, specials: SpecialTokens, lowercase: bool):
        self.kind = kind
        self.specials = specials
        self.lowercase = lowercase  # Applied before the model's own normalisation, as HF does.
        self._proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)

    def __getstate__(self):  # The processor is a C++ object; rebuild it from the proto.
        return {k: v for k, v in self.__dict__.items() if k != "_sp"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._sp = spm.SentencePieceProcessor(model_proto=self._proto)

    def get_vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def token_to_id(self, token: str) -> int | None:
        index = self._sp.piece_to_id(token)
        # piece_to_id answers unk's id for unknown pieces.
        return None if index == self._sp.unk_id() and token != self._sp.id_to_piece(index) else index

    def id_to_token(self, index: int) -> str:
        return self._sp.id_to_piece(index)

    def encode_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        texts = [t.lower() for t in texts] if self.lowercase else list(texts)
        return [np.asarray(ids, np.int32) for ids in self._sp.encode(texts)]

    def word_start_flags(self) -> np.ndarray:
        sp = self._sp
        return np.array(
            [
                sp.id_to_piece(i).startswith("▁") or sp.is_control(i) or sp.is_unknown(i)
                for i in range(sp.get_piece_size())
            ],
            bool,
        )

    def save(self, directory: str) -> None:
        paths.write_atomically(paths.path(directory) / SENTENCEPIECE_FILE, self._proto)
        if not self._bpe:
            # keep_accents: SentencePiece's own normalisation (in spiece.model) decides accents.
            self._write_config(directory, {"do_lower_case": self.lowercase, "keep_accents": True})
        else:
            paths.write_atomically(paths.path(directory) / TOKENIZER_FILE, self._hf_bpe().to_str(pretty=True))
            # Saying do_lower_case lets a reload rebuild the same tokenizer.json (same hash).
            self._write_config(directory, {"do_lower_case": self.lowercase})

    def fast_tokenizer(self) -> tokenizers.Tokenizer | None:
        return self._hf_bpe() if self._bpe else None

    @property
    def _bpe(self) -> bool:
        """A SentencePiece BPE model (else unigram): transformers reads it through a tokenizer.json of its own."""
        return get_kind(self.kind).sentencepiece_model == "BPE"

    def _hf_bpe(self) -> tokenizers.Tokenizer:
        """This SentencePiece BPE as a `tokenizers` BPE: merges ranked by the merged piece's id.

        SentencePiece numbers BPE pieces in merge order, so piece id is merge rank (the rule
        transformers' SentencePieceExtractor applies).
        """
        from sentencepiece import sentencepiece_model_pb2  # noqa: PLC0415

        model = sentencepiece_model_pb2.ModelProto.FromString(self._proto)
        # USER_DEFINED pieces (tokenizer_extension's added words, always last) are matched before the merges, as
        # SentencePiece matches them: added tokens, numbered after the model's vocabulary.
        user_defined = [p.piece for p in model.pieces if p.type == p.Type.USER_DEFINED]
        vocab = {p.piece: i for i, p in enumerate(model.pieces) if p.type != p.Type.USER_DEFINED}
        specials = set(self.specials.all())
        merges = sorted(
            (vocab[piece], vocab[piece[:k]], vocab[piece[k:]], piece[:k], piece[k:])
            for piece in vocab
            if piece not in specials
            for k in range(1, len(piece))
            if piece[:k] in vocab and piece[k:] in vocab
        )
        hf = tokenizers.Tokenizer(
            models.BPE(vocab, [(a, b) for *_, a, b in merges], unk_token=self.specials.unk, fuse_unk=True)
        )
        steps = [normalizers.Lowercase()] if self.lowercase else []
        if model.normalizer_spec.precompiled_charsmap:
            steps.append(normalizers.Precompiled(model.normalizer_spec.precompiled_charsmap))
        hf.normalizer = normalizers.Sequence(steps)
        hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        hf.decoder = tokenizers.decoders.Metaspace(replacement="▁", prepend_scheme="always")
        hf.add_special_tokens(list(self.specials.all()))
        hf.add_tokens([tokenizers.AddedToken(piece.removeprefix("▁"), single_word=True, lstrip=True, normalized=True)
                       for piece in user_defined])
        add_pair_template(hf, self.specials)
        return hf


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    *,
    kind: str = "unigram",
    lowercase: bool = True,
    specials: SpecialTokens | None = None,
) -> SentencePieceTokenizer:
    """ALBERT's SentencePiece (unigram or BPE): <pad>=0 <unk>=1 [CLS]=2 [SEP]=3 [MASK]=4.

    Lowercasing is the model's own normalisation rule (nmt_nfkc_cf), so spiece.model
    carries it to every loader. The vocabulary may come out smaller than vocab_size on a
    small sample (hard_vocab_limit off) rather than failing.
    """
    model_type = get_kind(kind).sentencepiece_model.lower()  # "unigram" or "bpe"
    if not model_type:
        raise ValueError(f"kind={kind!r} is not a SentencePiece kind")
    specials = specials or SENTENCEPIECE_SPECIALS
    model = io.BytesIO()
    spm.set_random_generator_seed(_SENTENCEPIECE_SEED)  # Sampling and shuffles, if any apply.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        model_type=model_type,
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        pad_id=0,
        pad_piece=specials.pad,
        unk_id=1,
        unk_piece=specials.unk,
        bos_id=-1,
        eos_id=-1,
        control_symbols=[specials.cls, specials.sep, specials.mask],
        normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
        character_coverage=0.9995,
        max_sentence_length=_MAX_SENTENCE_BYTES,
        num_threads=_SENTENCEPIECE_THREADS,
        minloglevel=2,
    )
    return SentencePieceTokenizer(kind, model.getvalue(), specials, lowercase)


def _extend(piece_type: str):
    """Each word appended as the piece `▁word`. Unigram: a NORMAL piece of score 0; scores are
    log-probabilities (< 0), so one piece of score 0 beats every segmentation of the word into two or more,
    and Viterbi takes it. BPE: a USER_DEFINED piece, which SentencePiece matches before its merges (merges
    alone could only build it through new intermediate pieces); tokenizer.json, for transformers, holds it as
    an added token."""
    def extend(tokenizer: SentencePieceTokenizer, words: Sequence[str], old_size: int) -> SentencePieceTokenizer:
        model = sentencepiece_model_pb2.ModelProto.FromString(tokenizer._proto)
        for word in words:
            model.pieces.add(piece=SENTENCEPIECE_SPACE + word, score=0.0,
                             type=model.SentencePiece.Type.Value(piece_type))
        return SentencePieceTokenizer(tokenizer.kind, model.SerializeToString(), tokenizer.specials,
                                      tokenizer.lowercase)
    return extend


def _train(kind: str):
    def train(texts: Iterable[str], vocab_size: int, min_frequency: int = 2, *, lowercase: bool = True,
              specials: SpecialTokens | None = None) -> SentencePieceTokenizer:
        del min_frequency  # SentencePiece has no minimum count: its vocabulary is cut by score
        return train_sentencepiece(texts, vocab_size, kind=kind, lowercase=lowercase, specials=specials)
    return train


UNIGRAM = register_kind(TokenizerKind(
    name="unigram", specials=SENTENCEPIECE_SPECIALS, hf_class="AlbertTokenizer", train=_train("unigram"),
    hf_model="Unigram", sentencepiece_model="UNIGRAM", extend=_extend("NORMAL"), extends=SentencePieceTokenizer))
# AlbertTokenizer reads spiece.model as unigram only: the generic fast class reads tokenizer.json.
SENTENCEPIECE_BPE = register_kind(TokenizerKind(
    name="sentencepiece_bpe", specials=SENTENCEPIECE_SPECIALS, hf_class="PreTrainedTokenizerFast",
    train=_train("sentencepiece_bpe"), sentencepiece_model="BPE", extend=_extend("USER_DEFINED"),
    extends=SentencePieceTokenizer))
