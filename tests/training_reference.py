"""The transformers + PyTorch side of the lockstep training parity test (tests/test_training_parity.py).

Each family's reference is the transformers model(s) a user of that family would train, loaded from bert_jax's
export, with the loss written from the paper and transformers' own semantics, not ported from bert_jax:
- MLM: the labels a data collator gives (-100 everywhere but at the predicted positions) and the model's own
  `labels=` loss (cross-entropy averaged over the predicted tokens of the whole batch); NSP / SOP through the
  pre-training classes' own `next_sentence_label` / `sentence_order_label`;
- ELECTRA (Clark et al. 2020, §2): generator MLM + lambda x the discriminator's BCE averaged over real tokens
  (ElectraForPreTraining's own loss), the two networks sharing one embeddings module (§3.2);
- DeBERTa-v3 (He et al. 2023, §3.2, GDES): the discriminator reads stop_grad(generator's word table) + delta,
  its head DeBERTa's `LMMaskPredictionHead` (LayerNorm(h + h_[CLS]), dense, activation, one unit);
- ModernBERT: a packed row is its documents, each alone in a padded row (what transformers' unpadded attention
  computes), a local layer seeing `local_attention // 2` tokens either side;
- DistilBERT (Sanh et al. 2019, the distiller of transformers' research project): alpha_ce * T^2 *
  KL(teacher_T || student_T) over the masked tokens (batchmean), alpha_mlm * MLM, alpha_cos * (1 - cos) of the
  last hidden states over real tokens (CosineEmbeddingLoss), the teacher frozen;
- SpanBERT (Joshi et al. 2020, §3.2): BertForMaskedLM's MLM + the span boundary objective, its spans found here
  from the masked positions (maximal runs, as SpanBERT's merge_intervals), each span token predicted by
  LayerNorm(GeLU(W2 LayerNorm(GeLU(W1 [x_{s-1}; x_{e+1}; p_{i-s+1}])))) decoded by the tied word embeddings.

Parameters are named as the export names them (`generator/` before a subfolder's), so the test compares the two
sides through the converter's own mapping. Replacements a generator samples come from bert_jax's step (the
test passes them in): both sides then train on the same corrupted rows.
"""
import numpy as np
import torch
import torch.nn.functional as F
import transformers

IGNORE = -100  # transformers' ignored label


def hf_model(class_name: str, hf_cfg: dict):
    """A transformers model of `class_name` built from a config.json dict (float32, dropout as the dict says)."""
    values = {k: v for k, v in hf_cfg.items() if k not in ("architectures", "model_type")}
    config = transformers.AutoConfig.for_model(hf_cfg["model_type"], **values)
    return getattr(transformers, class_name)(config)


def load(model: torch.nn.Module, state: dict) -> None:
    """The exported tensors into `model`: every one of the model's parameters given, no tensor left over."""
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()},
                                                strict=False)
    params = dict(model.named_parameters())
    assert not unexpected, unexpected
    assert not [m for m in missing if m in params], missing


def mlm_labels(batch: dict) -> torch.Tensor:
    """[batch, length] labels as DataCollatorForLanguageModeling writes them: the original id where predicted."""
    labels = np.full(batch["input_ids"].shape, IGNORE, np.int64)
    rows, preds = np.nonzero(batch["masked_weights"] > 0)
    labels[rows, batch["masked_positions"][rows, preds]] = batch["masked_ids"][rows, preds]
    return torch.from_numpy(labels)


def inputs(batch: dict, *keys) -> dict:
    return {k: torch.from_numpy(np.asarray(batch[k], np.int64)) for k in keys}


def decayed_names(model: torch.nn.Module) -> set[str]:
    """The parameters transformers' Trainer gives weight decay (its own rule: not in a LayerNorm, no bias, no
    norm in the name)."""
    return set(transformers.Trainer.get_decay_parameter_names(None, model))  # `self` is unused there


class Reference:
    """One family's torch side. `folders`: {"" or "generator/": model} whose state dicts carry the export's names;
    `loss(batch, corrupted)` -> (loss, {term: value})."""

    folders: dict

    def named_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """Each trainable parameter once (tied and shared ones under their first name)."""
        seen, out = set(), []
        for prefix, model in self.folders.items():
            for name, p in model.named_parameters():
                if id(p) not in seen and p.requires_grad and name not in self.frozen_names(prefix):
                    seen.add(id(p))
                    out.append((prefix + name, p))
        return out

    def frozen_names(self, prefix: str) -> tuple[str, ...]:
        return ()

    def decays(self) -> dict[str, bool]:
        """{parameter name: takes weight decay} by transformers Trainer's rule, under every name it has."""
        out = {}
        for prefix, model in self.folders.items():
            decayed = decayed_names(model)
            for name, _ in model.named_parameters(remove_duplicate=False):
                out[prefix + name] = name in decayed
        return out

    def state(self) -> dict[str, np.ndarray]:
        return {prefix + k: v.detach().numpy().copy() for prefix, model in self.folders.items()
                for k, v in model.state_dict().items()}


class PreTraining(Reference):
    """BertForPreTraining (MLM + NSP), AlbertForPreTraining (MLM + SOP), or an MLM-only model (RoBERTa)."""

    def __init__(self, class_name: str, exported, sentence_label: str = "", token_types: bool = True):
        self.model = hf_model(class_name, exported.config).eval()
        load(self.model, exported.state)
        self.folders = {"": self.model}
        self.sentence_label, self.token_types = sentence_label, token_types

    def loss(self, batch: dict, corrupted=None):
        keys = ("input_ids", "attention_mask") + (("token_type_ids",) if self.token_types else ())
        extra = {self.sentence_label: torch.from_numpy(np.asarray(batch[self.sentence_label], np.int64))
                 } if self.sentence_label else {}
        out = self.model(**inputs(batch, *keys), labels=mlm_labels(batch), **extra)
        return out.loss, {}


class ModernBert(Reference):
    """ModernBertForMaskedLM on each packed row's documents, one to a padded row (unpadded attention's result)."""

    def __init__(self, exported, pad_token_id: int):
        self.model = hf_model("ModernBertForMaskedLM", exported.config).eval()
        load(self.model, exported.state)
        self.folders = {"": self.model}
        self.pad = pad_token_id

    def documents(self, batch: dict) -> dict:
        ids, labels, segments = batch["input_ids"], mlm_labels(batch).numpy(), batch["segment_ids"]
        rows = [(r, s) for r in range(len(ids)) for s in np.unique(segments[r]) if s > 0]
        length = ids.shape[1]
        out = {"input_ids": np.full((len(rows), length), self.pad), "attention_mask": np.zeros((len(rows), length)),
               "labels": np.full((len(rows), length), IGNORE)}
        for i, (r, s) in enumerate(rows):
            where = segments[r] == s
            n = int(where.sum())
            out["input_ids"][i, :n], out["labels"][i, :n] = ids[r][where], labels[r][where]
            out["attention_mask"][i, :n] = 1
        return {k: torch.from_numpy(v.astype(np.int64)) for k, v in out.items()}

    def loss(self, batch: dict, corrupted=None):
        return self.model(**self.documents(batch)).loss, {}


class ModernBertDecoder(ModernBert):
    """ModernBertDecoderForCausalLM on each packed row's documents: every real token is its own label, transformers
    shifting them (the next-token loss, averaged over every predicted token of the batch, as bert_jax's)."""

    def __init__(self, exported, pad_token_id: int):
        self.model = hf_model("ModernBertDecoderForCausalLM", exported.config).eval()
        load(self.model, exported.state)
        self.folders = {"": self.model}
        self.pad = pad_token_id

    def loss(self, batch: dict, corrupted=None):
        documents = self.documents(dict(batch, masked_weights=np.zeros((len(batch["input_ids"]), 0)),
                                        masked_positions=np.zeros((len(batch["input_ids"]), 0), np.int32),
                                        masked_ids=np.zeros((len(batch["input_ids"]), 0), np.int32)))
        labels = torch.where(documents["attention_mask"] > 0, documents["input_ids"], IGNORE)
        return self.model(input_ids=documents["input_ids"], attention_mask=documents["attention_mask"],
                          labels=labels).loss, {}


class Electra(Reference):
    """ElectraForMaskedLM (generator) and ElectraForPreTraining (discriminator) over one embeddings module."""

    def __init__(self, exported, discriminator_weight: float):
        self.disc = hf_model("ElectraForPreTraining", exported.config).eval()
        gen_state, gen_cfg = exported.subfolders["generator"]
        self.gen = hf_model("ElectraForMaskedLM", gen_cfg).eval()
        load(self.disc, exported.state)
        load(self.gen, gen_state)
        # §3.2: the generator and the discriminator share token, position and type embeddings (and their
        # LayerNorm); the generator's decoder is tied to the shared word table.
        self.gen.electra.embeddings = self.disc.electra.embeddings
        self.gen.generator_lm_head.weight = self.disc.electra.embeddings.word_embeddings.weight
        self.folders = {"": self.disc, "generator/": self.gen}
        self.weight = discriminator_weight

    def loss(self, batch: dict, corrupted):
        keys = ("attention_mask", "token_type_ids")
        labels = mlm_labels(batch)
        gen = self.gen(**inputs(batch, "input_ids", *keys), labels=labels).loss
        original = torch.where(labels >= 0, labels, inputs(batch, "input_ids")["input_ids"])
        replaced = (torch.from_numpy(np.asarray(corrupted, np.int64)) != original).float()
        disc = self.disc(input_ids=torch.from_numpy(np.asarray(corrupted, np.int64)), **inputs(batch, *keys),
                         labels=replaced).loss
        return gen + self.weight * disc, {"generator_mlm_loss": gen, "discriminator_loss": disc}


class MaskPredictionHead(torch.nn.Module):
    """DeBERTa's replaced-token head (the original code's `LMMaskPredictionHead`, released as `mask_predictions`):
    every token's state next to [CLS]'s, LayerNorm-ed, then dense, activation and a one-unit classifier."""

    def __init__(self, hidden: int, eps: float, act: str):
        super().__init__()
        self.LayerNorm = torch.nn.LayerNorm(hidden, eps=eps)
        self.dense = torch.nn.Linear(hidden, hidden)
        self.classifier = torch.nn.Linear(hidden, 1)
        self.act = transformers.activations.ACT2FN[act]

    def forward(self, hidden):
        return self.classifier(self.act(self.dense(self.LayerNorm(hidden + hidden[:, :1])))).squeeze(-1)


class DebertaDiscriminator(torch.nn.Module):
    def __init__(self, hf_cfg: dict):
        super().__init__()
        self.deberta = hf_model("DebertaV2Model", hf_cfg)
        config = self.deberta.config
        self.mask_predictions = MaskPredictionHead(config.hidden_size, config.layer_norm_eps, config.hidden_act)


class DebertaV3(Reference):
    """DebertaV2ForMaskedLM (generator) and a DebertaV2Model discriminator with GDES embeddings."""

    WORD = "deberta.embeddings.word_embeddings.weight"

    def __init__(self, exported, discriminator_weight: float):
        gen_state, gen_cfg = exported.subfolders["generator"]
        self.gen = hf_model("DebertaV2ForMaskedLM", gen_cfg).eval()
        load(self.gen, gen_state)
        self.disc = DebertaDiscriminator(exported.config).eval()
        load(self.disc, exported.state)
        # GDES: the discriminator's table is the generator's (no gradient) plus its own delta; the export holds the
        # sum, so the delta starts at (exported sum - generator's table).
        word = self.gen.get_input_embeddings().weight
        self.delta = torch.nn.Parameter(torch.from_numpy(exported.state[self.WORD] - gen_state[self.WORD]))
        self.folders = {"": self.disc, "generator/": self.gen}
        self.word, self.weight = word, discriminator_weight

    def frozen_names(self, prefix: str) -> tuple[str, ...]:
        return (self.WORD,) if prefix == "" else ()  # the merged table: the delta below trains instead

    def named_parameters(self):
        return super().named_parameters() + [("delta", self.delta)]

    def decays(self) -> dict[str, bool]:
        return {**super().decays(), "delta": True}

    def state(self) -> dict[str, np.ndarray]:
        merged = (self.word.detach() + self.delta.detach()).numpy()
        return {**super().state(), self.WORD: merged}

    def loss(self, batch: dict, corrupted):
        labels = mlm_labels(batch)
        gen = self.gen(**inputs(batch, "input_ids", "attention_mask"), labels=labels).loss
        ids = torch.from_numpy(np.asarray(corrupted, np.int64))
        original = torch.where(labels >= 0, labels, inputs(batch, "input_ids")["input_ids"])
        embeds = F.embedding(ids, self.word.detach() + self.delta)
        mask = inputs(batch, "attention_mask")["attention_mask"]
        hidden = self.disc.deberta(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
        logits = self.disc.mask_predictions(hidden)
        real = mask > 0
        disc = F.binary_cross_entropy_with_logits(logits[real], (ids != original).float()[real])
        return gen + self.weight * disc, {"generator_mlm_loss": gen, "discriminator_loss": disc}


class Distillation(Reference):
    """DistilBertForMaskedLM taught by a frozen BertForPreTraining, as transformers' distiller trains it."""

    def __init__(self, exported, teacher_state: dict, teacher_cfg: dict, distill_cfg, with_cosine: bool):
        self.student = hf_model("DistilBertForMaskedLM", exported.config).eval()
        load(self.student, exported.state)
        self.teacher = hf_model("BertForPreTraining", teacher_cfg).eval()
        load(self.teacher, teacher_state)
        self.teacher.requires_grad_(False)
        self.folders = {"": self.student}
        self.t = float(distill_cfg.temperature)
        self.alpha_ce, self.alpha_mlm = float(distill_cfg.kl_weight), float(distill_cfg.mlm_weight)
        self.alpha_cos = float(distill_cfg.cosine_weight) if with_cosine else 0.0

    def loss(self, batch: dict, corrupted=None):
        labels = mlm_labels(batch)
        student = self.student(**inputs(batch, "input_ids", "attention_mask"), labels=labels,
                               output_hidden_states=True)
        with torch.no_grad():
            teacher = self.teacher(**inputs(batch, "input_ids", "attention_mask", "token_type_ids"),
                                   output_hidden_states=True)
        selected = labels > IGNORE
        s_logits, t_logits = student.logits[selected], teacher.prediction_logits[selected]
        kl = torch.nn.KLDivLoss(reduction="batchmean")(F.log_softmax(s_logits / self.t, dim=-1),
                                                       F.softmax(t_logits / self.t, dim=-1)) * self.t**2
        loss = self.alpha_ce * kl + self.alpha_mlm * student.loss
        terms = {"kl_loss": kl, "mlm_loss": student.loss}
        if self.alpha_cos:
            real = inputs(batch, "attention_mask")["attention_mask"] > 0
            s_hidden, t_hidden = student.hidden_states[-1][real], teacher.hidden_states[-1][real]
            cos = torch.nn.CosineEmbeddingLoss(reduction="mean")(s_hidden, t_hidden, torch.ones(len(s_hidden)))
            loss, terms["cosine_loss"] = loss + self.alpha_cos * cos, cos
        return loss, terms


class SpanBoundaryHead(torch.nn.Module):
    """The SBO's predictor as the paper writes it (§3.2, eq. 1-2), with SpanBERT's tied decoder and bias."""

    def __init__(self, hidden: int, position_size: int, max_span_tokens: int, vocab: int, eps: float):
        super().__init__()
        self.position_embeddings = torch.nn.Embedding(max_span_tokens, position_size)
        self.dense_1 = torch.nn.Linear(2 * hidden + position_size, hidden)
        self.layer_norm_1 = torch.nn.LayerNorm(hidden, eps=eps)
        self.dense_2 = torch.nn.Linear(hidden, hidden)
        self.layer_norm_2 = torch.nn.LayerNorm(hidden, eps=eps)
        self.bias = torch.nn.Parameter(torch.zeros(vocab))

    def forward(self, hidden, rows, left, right, offset, word):
        h0 = torch.cat([hidden[rows, left], hidden[rows, right], self.position_embeddings(offset)], -1)
        h1 = self.layer_norm_1(F.gelu(self.dense_1(h0)))
        y = self.layer_norm_2(F.gelu(self.dense_2(h1)))
        return y @ word.T + self.bias


def span_targets(labels: np.ndarray, max_span_tokens: int):
    """(rows, left, right, offset, target) of every span token the SBO predicts: the spans are the maximal runs of
    labelled positions; a span at the row's edge (no boundary token) and offsets past the table are left out."""
    out = []
    length = labels.shape[1]
    for r, row in enumerate(labels):
        masked = np.flatnonzero(row != IGNORE)
        runs = np.split(masked, np.flatnonzero(np.diff(masked) > 1) + 1) if len(masked) else []
        for run in runs:
            s, e = int(run[0]), int(run[-1])
            if s - 1 < 0 or e + 1 >= length:
                continue
            out += [(r, s - 1, e + 1, i - s, int(row[i])) for i in range(s, e + 1) if i - s < max_span_tokens]
    return [torch.tensor(column) for column in zip(*out)]


class SpanBert(Reference):
    """BertForMaskedLM (the export) and the SBO head (not exported: initialised from bert_jax's `span_boundary`
    params, and named by their paths there, so the test compares them too)."""

    HEAD = "span_boundary"
    # torch name -> (our path under HEAD, transposed)
    NAMES = {"position_embeddings.weight": ("position/embedding", False), "dense_1.weight": ("dense_1/kernel", True),
             "dense_1.bias": ("dense_1/bias", False), "layer_norm_1.weight": ("norm_1/norm/scale", False),
             "layer_norm_1.bias": ("norm_1/norm/bias", False), "dense_2.weight": ("dense_2/kernel", True),
             "dense_2.bias": ("dense_2/bias", False), "layer_norm_2.weight": ("norm_2/norm/scale", False),
             "layer_norm_2.bias": ("norm_2/norm/bias", False), "bias": ("output_bias", False)}

    def __init__(self, exported, head_params: dict, model_cfg):
        self.model = hf_model("BertForMaskedLM", exported.config).eval()
        load(self.model, exported.state)
        self.folders = {"": self.model}
        self.max_span_tokens, self.weight = model_cfg.sbo_max_span_tokens, float(model_cfg.sbo_loss_weight)
        self.head = SpanBoundaryHead(model_cfg.hidden_size, model_cfg.sbo_position_size, self.max_span_tokens,
                                     model_cfg.vocab_size, model_cfg.layer_norm_eps).eval()
        state = {}
        for name, (path, transposed) in self.NAMES.items():
            value = head_params
            for key in path.split("/"):
                value = value[key]
            state[name] = torch.from_numpy(np.array(value.T if transposed else value))
        self.head.load_state_dict(state, strict=True)

    def _ours(self, name: str) -> str:
        return f"{self.HEAD}/{self.NAMES[name][0]}"

    def named_parameters(self):
        return super().named_parameters() + [(self._ours(n), p) for n, p in self.head.named_parameters()]

    def decays(self) -> dict[str, bool]:
        decayed = decayed_names(self.head)
        return {**super().decays(), **{self._ours(n): n in decayed for n, _ in self.head.named_parameters()}}

    def state(self) -> dict[str, np.ndarray]:
        head = {self._ours(n): (v.T if self.NAMES[n][1] else v).detach().numpy().copy()
                for n, v in self.head.state_dict().items()}
        return {**super().state(), **head}

    def loss(self, batch: dict, corrupted=None):
        labels = mlm_labels(batch)
        out = self.model(**inputs(batch, "input_ids", "attention_mask", "token_type_ids"), labels=labels,
                         output_hidden_states=True)
        rows, left, right, offset, target = span_targets(labels.numpy(), self.max_span_tokens)
        logits = self.head(out.hidden_states[-1], rows, left, right, offset,
                           self.model.bert.embeddings.word_embeddings.weight)
        sbo = F.cross_entropy(logits, target)
        return out.loss + self.weight * sbo, {"mlm_loss": out.loss, "sbo_loss": sbo}
