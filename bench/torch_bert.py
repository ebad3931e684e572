"""The Hugging Face PyTorch side of bench/accelerator_throughput.py: what a plain HF script trains.

The family's own `*ForMaskedLM` (BertForMaskedLM for the BERT shapes; ModernBertForMaskedLM,
DebertaV2ForMaskedLM, ... for a config's family, from the config.json our export writes), random
init from that config (nothing is downloaded),
SDPA attention, `torch.optim.AdamW` (fused on CUDA), gradient clipping at the config's
norm, bf16 autocast on accelerators, eager or `torch.compile`d. With `sparse_head` (the
default: each side at its best) the masked positions are gathered from the encoder's output
before the class's own MLM head, as bert_jax does (and ModernBERT's `sparse_prediction`):
the same loss and gradients as the head at every position with `labels` of -100, at a
fraction of the head's cost. Without it the head scores every position, as the classes do
out of the box. Both sides are charged the same FLOP formula.
"""
import inspect
import time

import numpy as np
import torch
import transformers

GIB = 1024**3


def torch_device(jax_platform: str) -> torch.device:
    """The device torch shares with JAX: cuda:0 when JAX runs on a GPU, else the CPU."""
    if jax_platform == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError("JAX runs on a GPU but torch sees no CUDA device; install a CUDA build of torch")
        return torch.device("cuda", 0)
    if jax_platform != "cpu":
        raise RuntimeError(f"the PyTorch sides run on CUDA or the CPU, not beside JAX on {jax_platform}; "
                           "pass --sides=bert_jax")
    return torch.device("cpu")


def bert_config(model_cfg) -> transformers.BertConfig:
    return transformers.BertConfig(
        vocab_size=model_cfg.vocab_size, hidden_size=model_cfg.hidden_size, num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads, intermediate_size=model_cfg.intermediate_size,
        max_position_embeddings=model_cfg.max_position_embeddings, type_vocab_size=model_cfg.type_vocab_size,
        hidden_dropout_prob=model_cfg.dropout_rate, attention_probs_dropout_prob=model_cfg.attention_dropout_rate,
        layer_norm_eps=model_cfg.layer_norm_eps, attn_implementation="sdpa",
    )


def mlm_labels(batch: dict) -> np.ndarray:
    """[B, S] int64: the original id at each masked position with weight 1, -100 elsewhere."""
    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    rows, slots = np.nonzero(batch["masked_weights"] > 0)
    labels[rows, batch["masked_positions"][rows, slots]] = batch["masked_ids"][rows, slots]
    return labels


def sparse_labels(batch: dict) -> np.ndarray:
    """[B, P] int64: the original id of each predicted slot, -100 for the padding slots (weight 0)."""
    return np.where(batch["masked_weights"] > 0, batch["masked_ids"], -100).astype(np.int64)


def gather_before_head(model: torch.nn.Module, positions: torch.Tensor) -> None:
    """The class's MLM head (and loss) runs on the hidden states at `positions` [B, P] only: a forward hook on its
    base model (`base_model_prefix`) replaces the encoder's last hidden state [B, S, H] by [B, P, H]. Every masked-LM
    class here feeds `outputs[0]` to its head, so the labels become [B, P] (`sparse_labels`)."""
    def gather(module, args, output):
        output["last_hidden_state"] = torch.take_along_dim(output["last_hidden_state"], positions[..., None], dim=1)
        return output

    getattr(model, model.base_model_prefix).register_forward_hook(gather)


def masked_lm(hf_config: dict | None, model_cfg) -> torch.nn.Module:
    """A random-init HF masked-LM: of `hf_config` (a config.json dict our export writes), else BERT of model_cfg's
    sizes. SDPA attention where the architecture has it (DeBERTa-v2 has only its eager attention): what a
    plain HF script gets without extra packages."""
    if hf_config is None:
        return transformers.BertForMaskedLM(bert_config(model_cfg))
    fields = {k: v for k, v in hf_config.items() if k not in ("model_type", "architectures", "transformers_version")}
    cfg = transformers.AutoConfig.for_model(hf_config["model_type"], **fields)
    try:
        return transformers.AutoModelForMaskedLM.from_config(cfg, attn_implementation="sdpa")
    except ValueError as error:
        if "scaled_dot_product_attention" not in str(error):
            raise
        return transformers.AutoModelForMaskedLM.from_config(cfg, attn_implementation="eager")


class TorchBertSide:
    """One HF model + optimizer on one device; `train_steps` / `forward_steps` return seconds per step."""

    def __init__(self, name: str, config, batch: dict, device: torch.device, autocast_bf16: bool,
                 compile_mode: str | None, hf_config: dict | None = None, sparse_head: bool = True):
        self.name = name
        self.device = device
        torch.manual_seed(0)
        self.model = masked_lm(hf_config, config.model).to(device)
        positions = torch.as_tensor(batch["masked_positions"], dtype=torch.long, device=device)
        if sparse_head:
            gather_before_head(self.model, positions)
        t = config.train
        self.max_grad_norm = t.max_grad_norm
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=t.learning_rate, betas=(t.b1, t.b2), eps=t.eps,
            weight_decay=t.weight_decay, fused=device.type == "cuda",
        )
        self.forward = self.model if compile_mode is None else torch.compile(self.model, mode=compile_mode)
        # Only what this model's forward takes (ModernBERT has no token types; DeBERTa-v3 has none in use).
        accepted = inspect.signature(self.model.forward).parameters
        types = getattr(self.model.config, "type_vocab_size", 0)
        self.inputs = {
            key: torch.as_tensor(batch[key], dtype=torch.long, device=device)
            for key in ("input_ids", "attention_mask", "token_type_ids")
            if key in accepted and key in batch and (key != "token_type_ids" or types > 1)
        }
        self.labels = torch.as_tensor(sparse_labels(batch) if sparse_head else mlm_labels(batch), device=device)
        self.autocast = dict(device_type=device.type, dtype=torch.bfloat16, enabled=autocast_bf16)
        self.first_train_s = self.first_forward_s = float("nan")  # eager: warm-up; compile: tracing + codegen

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _train_step(self) -> torch.Tensor:
        self.model.train()
        with torch.autocast(**self.autocast):
            loss = self.forward(**self.inputs, labels=self.labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _forward_step(self) -> torch.Tensor:
        self.model.eval()
        with torch.no_grad(), torch.autocast(**self.autocast):
            return self.forward(**self.inputs, labels=self.labels).loss

    def _timed(self, fn, steps: int) -> float:
        self._sync()
        start = time.perf_counter()
        for _ in range(steps):
            loss = fn()
        loss.item()  # Waits for the last step, like the JAX side's block_until_ready.
        self._sync()
        return (time.perf_counter() - start) / steps

    def warm_up(self, steps: int) -> None:
        """Runs (and for torch.compile, compiles) both programs; the first call of each is timed apart."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.first_train_s = self._timed(self._train_step, 1)
        self.first_forward_s = self._timed(self._forward_step, 1)
        self._timed(self._train_step, steps)
        self._timed(self._forward_step, steps)

    def train_steps(self, steps: int) -> float:
        return self._timed(self._train_step, steps)

    def forward_steps(self, steps: int) -> float:
        return self._timed(self._forward_step, steps)

    def peak_bytes(self) -> tuple[float, str]:
        if self.device.type == "cuda":
            return float(torch.cuda.max_memory_allocated(self.device)), "torch.cuda.max_memory_allocated"
        return float("nan"), "n/a on CPU"

    def release_cache(self) -> None:
        """Hands torch's cached blocks back to the driver, so JAX's next round can allocate them."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def close(self) -> None:
        del self.model, self.forward, self.optimizer, self.inputs, self.labels
        self.release_cache()
