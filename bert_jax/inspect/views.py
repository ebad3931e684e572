"""Views inside a model for one sentence: fill-mask candidates and attention maps (`bert-jax inspect`,
bert_jax/commands/inspect.py, is the command).

A source is a pre-training workdir (its newest checkpoint; `DIR:STEP` for another) or a Hugging Face folder of any
registered family, read as fine-tuning reads `config.init_from`. The attention view runs the reference (`xla`)
kernel, which sows its probabilities into the `intermediates` collection; only this module makes that collection
mutable, so training never pays for it ("What does BERT look at?", Clark et al. 2019, reads the same maps).
"""
import dataclasses
import io
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import UserError
from bert_jax.checkpoint import reference
from bert_jax.finetune import init_from
from bert_jax.run import lineage
from bert_jax.storage import paths
from data_pipelines.tokenizers.tokenizer import load_tokenizer

MODES = ("fill_mask", "attention")
# The longest text read by a model without a table of absolute positions (DeBERTa-v3's relative ones: its Hugging
# Face folder's model config has no max_position_embeddings): BERT's length.
UNPOSITIONED_MAX_LENGTH = 512
MASK_MARKERS = ("[MASK]", "<mask>")
# How the model runs here: the reference kernel (the only one that exposes its probabilities), in float32.
RUNTIME = {"attention_impl": "xla", "dtype": "float32", "param_dtype": "float32", "remat_policy": "none",
           "dropout_rate": 0.0, "attention_dropout_rate": 0.0}


@dataclasses.dataclass
class Inspector:
    """A family module with its parameters and tokenizer, ready to apply to one sentence.

    It runs two of the module's methods (bert_jax.models.layers.EncoderModel), which need the inputs alone, never an
    objective's own keys (a span's boundaries, a generator's sample): `masked_lm_logits` for fill-mask and `encode`,
    the encoder that fine-tuning and the export start from (a replaced-token detector's discriminator), for
    attention."""
    module: Any
    params: dict
    tokenizer: Any
    max_length: int
    # One jitted apply per (method, collection list), so a second sentence of the same length does not recompile.
    _compiled: dict = dataclasses.field(default_factory=dict, repr=False)

    def apply(self, batch: dict, method: str, mutable: tuple[str, ...] = ()):
        if (method, mutable) not in self._compiled:
            self._compiled[method, mutable] = jax.jit(lambda p, b: self.module.apply(
                {"params": p}, b, deterministic=True, method=method, mutable=list(mutable) or False))
        return self._compiled[method, mutable](self.params, batch)


def load(source: str, scan_layers: bool = False) -> Inspector:
    """The model `source` names (a workdir, `DIR:STEP`, or an HF folder); fails naming the path otherwise."""
    resolved = init_from.resolve(source, dict(RUNTIME, scan_layers=scan_layers), key="--from")
    module = resolved.family.build_model(resolved.model_cfg)
    return Inspector(module, resolved.params, load_tokenizer(resolved.tokenizer_dir),
                     int(resolved.model_cfg.get("max_position_embeddings", UNPOSITIONED_MAX_LENGTH)))


def provenance(source: str) -> list[str]:
    """Where a pre-training workdir's run came from ("lineage: a@100 > b", "averaged from: ..."): what is inspected
    may be a branch or an average, not a run trained from scratch. [] for any other source."""
    return lineage.lines(reference.split(source)[0])


def encode(tokenizer, text: str, max_length: int) -> tuple[np.ndarray, list[int]]:
    """[CLS] text [SEP] as ids [length] int32, and the positions of the masks written in `text`.

    The text is split at the mask markers and each piece tokenized on its own, so the mask
    becomes the tokenizer's one mask id whatever the tokenizer does with "[MASK]" as text.
    """
    specials = tokenizer.specials
    ids, positions = [tokenizer.token_to_id(specials.cls)], []
    pieces = re.split("(" + "|".join(map(re.escape, MASK_MARKERS)) + ")", text)
    for i, piece in enumerate(pieces):
        if piece in MASK_MARKERS:
            positions.append(len(ids))
            ids.append(tokenizer.token_to_id(specials.mask))
        elif piece.strip():
            # A space before a mask belongs to the masked word (byte-level BPE marks it on the word).
            before_mask = i + 1 < len(pieces) and pieces[i + 1] in MASK_MARKERS
            ids.extend(tokenizer.encode_ids([piece.rstrip() if before_mask else piece])[0].tolist())
    ids.append(tokenizer.token_to_id(specials.sep))
    if len(ids) > max_length:
        raise UserError(f"--text is {len(ids)} tokens with [CLS] and [SEP]; the model takes at most {max_length}")
    return np.asarray(ids, np.int32), positions


def _batch(ids: np.ndarray, positions: list[int] | None = None) -> dict:
    ids = jnp.asarray(ids)[None]
    batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids), "token_type_ids": jnp.zeros_like(ids)}
    return batch if positions is None else dict(batch, masked_positions=jnp.asarray([positions], jnp.int32))


def fill_mask(inspector: Inspector, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
    """For each mask in `text`, in order, the `top_k` (token, probability) pairs of the model's MLM head."""
    tok = inspector.tokenizer
    ids, positions = encode(tok, text, inspector.max_length)
    if not positions:
        raise UserError(f"--text={text!r} holds no mask: write {' or '.join(MASK_MARKERS)} where a word is hidden")
    # The model's vocabulary may be padded past the tokenizer's; those ids are no tokens.
    logits = np.asarray(inspector.apply(_batch(ids, positions), "masked_lm_logits")[0, :, :tok.get_vocab_size()],
                        np.float64)
    if np.all(logits.std(axis=-1) == 0):
        print("note: the MLM head scores every token alike: this checkpoint has no trained MLM head "
              "(e.g. a sentence-embedding BertModel); the candidates below mean nothing")
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    best = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    return [[(tok.id_to_token(int(i)), float(p[i])) for i in row] for p, row in zip(probs, best)]


def _collect_probs(tree) -> list[np.ndarray]:
    """Every sown attention_probs, in call order, as [batch, heads, q, k] arrays (scanned ones unstacked)."""
    found = []
    for name, value in tree.items():  # insertion order is call order (layers_10 after layers_9)
        if name == "attention_probs":
            for array in value:
                array = np.asarray(array)
                found.extend(array if array.ndim == 5 else [array])
        elif isinstance(value, dict) or hasattr(value, "items"):
            found.extend(_collect_probs(value))
    return found


def batch_attention(inspector: Inspector, batch: dict) -> np.ndarray:
    """The attention probabilities of a batch (input_ids, attention_mask, token_type_ids), as the encoder sows
    them: [batch, layers, heads, length, length] (query, key)."""
    _, state = inspector.apply(batch, "encode", mutable=("intermediates",))
    layers = _collect_probs(state.get("intermediates", {}))
    if not layers:
        raise ValueError("the model sowed no attention probabilities: its attention does not run through "
                         "bert_jax.models.attention.Attend's xla kernel")
    return np.stack(layers, axis=1)


def attention_maps(inspector: Inspector, text: str) -> tuple[list[str], np.ndarray]:
    """The tokens of `text` and its attention probabilities [layers, heads, length, length] (query, key)."""
    ids, _ = encode(inspector.tokenizer, text, inspector.max_length)
    probs = batch_attention(inspector, _batch(ids))
    tokens = [inspector.tokenizer.id_to_token(int(i)) for i in ids]
    return tokens, probs[0]


def plot_attention(tokens: list[str], probs: np.ndarray, out: str) -> None:
    """A PNG grid, a row per layer and a column per head; queries down, keys across, tokens on both axes."""
    # matplotlib costs about half a second to load, and only plots need it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"), so no display is needed

    num_layers, num_heads, length, _ = probs.shape
    cell = max(1.6, 0.16 * length)
    fig, axes = plt.subplots(num_layers, num_heads, figsize=(cell * num_heads, cell * num_layers), squeeze=False)
    fontsize = max(3, min(8, 160 // max(length, 1)))
    for layer in range(num_layers):
        for head in range(num_heads):
            ax = axes[layer, head]
            ax.imshow(probs[layer, head], cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_xticks(range(length), tokens, rotation=90, fontsize=fontsize)
            ax.set_yticks(range(length), tokens, fontsize=fontsize)
            ax.set_title(f"layer {layer} head {head}", fontsize=fontsize + 2)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=80)
    plt.close(fig)
    paths.write_atomically(out, png.getvalue())
