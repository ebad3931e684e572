"""Continuing a prompt with a causally trained checkpoint (`bert-jax inspect --mode=generate`): what a causal run (or a
biphasic run's causal phase, `DIR:STEP`) learned, read as text.

The prompt is [CLS] and its tokens, as the pipeline starts each document; each new token is the argmax of the LM head
at the last position (greedy), or drawn from softmax(logits / temperature). Generation stops at [SEP] (a document's
end) or after `max_new_tokens`. Every step runs the whole prefix again, padded to one length so that one program
serves them all: no key-value cache, which a checkpoint this tool inspects does not need.
"""
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import UserError
from bert_jax.inspect.views import Inspector

MODE = "generate"


def check_causal(inspector: Inspector, source: str) -> None:
    if not getattr(inspector.module.config, "causal", False):
        raise UserError(f"--mode=generate needs a causally trained checkpoint (config.model.objective='clm', or a "
                        f"ModernBertDecoderForCausalLM folder); --from={source} is a bidirectional model")


def generate(inspector: Inspector, text: str, max_new_tokens: int = 32, temperature: float = 0.0,
             seed: int = 0) -> tuple[str, list[int]]:
    """(the continuation as text, its token ids) of `text`, greedy at temperature 0, else sampled (seeded)."""
    tok = inspector.tokenizer
    specials = tok.specials
    prompt = [tok.token_to_id(specials.cls), *tok.encode_ids([text])[0].tolist()]
    length = min(inspector.max_length, len(prompt) + max_new_tokens)
    if len(prompt) >= length:
        raise UserError(f"--text is {len(prompt)} tokens with [CLS]; the model takes at most {inspector.max_length}, "
                        f"so nothing is left to generate")
    sep, vocab = tok.token_to_id(specials.sep), tok.get_vocab_size()
    ids = np.zeros((1, length), np.int32)
    ids[0, :len(prompt)] = prompt
    key, new = jax.random.key(seed), []
    for position in range(len(prompt), length):
        batch = {"input_ids": jnp.asarray(ids), "attention_mask": jnp.asarray((np.arange(length) < position)[None]),
                 "token_type_ids": jnp.zeros_like(jnp.asarray(ids))}
        logits = np.asarray(inspector.apply(batch, "__call__")["clm_logits"][0, position - 1, :vocab], np.float64)
        if temperature > 0:
            key, draw = jax.random.split(key)
            token = int(jax.random.categorical(draw, jnp.asarray(logits / temperature)))
        else:
            token = int(np.argmax(logits))
        if token == sep:
            break
        ids[0, position] = token
        new.append(token)
    fast = tok.fast_tokenizer()  # the HF tokenizers object, which joins pieces as the text had them
    return (fast.decode(new) if fast is not None else " ".join(map(tok.id_to_token, new))), new
