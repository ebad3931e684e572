"""A Hugging Face Hub model card with every export: OUT/README.md, written by `export`, `finetune-export` and `average`.

The card is built with huggingface_hub's `ModelCardData` (the front matter: library, tags, pipeline tag, license,
datasets, a `model-index` holding the final eval results) and saved as a `ModelCard`, so `ModelCard.load(OUT /
"README.md")` reads it back and the Hub shows it as it shows any card. Its body says what the model is (family,
size), what it was trained on (the data and mixture), how long (steps and tokens), where it came from (lineage:
branch, average, growth, fine-tuning source), its final eval metrics and the command that made it.

Everything comes from the run's own records (DIR/config.json, metrics.jsonl, results.json for a fine-tuned run) and
the exported folder (its config.json's `architectures` give the pipeline tag, as the Hub infers it): nothing here
knows a family or a task kind by name. The license is the run's `config.license` (a Hub license id; "unknown" by
default, and for runs recorded before the key existed).
"""
from __future__ import annotations

import json
import shlex
import sys

import numpy as np
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from bert_jax.checkpoint.params import state_metadata
from bert_jax.objective_names import is_causal
from bert_jax.run import lineage, metrics_file
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.train import counters, stages
from data_pipelines.sources import mixture

CARD_FILE = "README.md"
LIBRARY = "bert_jax"
UNKNOWN_LICENSE = "unknown"
# The transformers head an exported config.json names (its class's suffix) -> the Hub's pipeline tag. A pre-training
# export's <Family>ForPreTraining is fill-mask when it holds an MLM head beside the sentence-level one (BERT's NSP,
# ALBERT's SOP: it loads as AutoModelForMaskedLM); one without (ELECTRA's discriminator, a replaced/original classifier
# per token, which no Hub pipeline serves) gets no tag (_pipeline_tag); its generator/ subfolder is the fill-mask model.
PIPELINE_TAGS = {"ForMaskedLM": "fill-mask", "ForPreTraining": "fill-mask", "ForCausalLM": "text-generation",
                 "ForSequenceClassification": "text-classification", "ForTokenClassification": "token-classification",
                 "ForQuestionAnswering": "question-answering", "Model": "feature-extraction"}
SENTENCE_TRANSFORMERS_FILE = "modules.json"  # a sentence-transformers folder (a sentence-embedding run's export)


def command_line(command: str) -> str:
    """The command this process runs, as a user types it: `bert-jax <command> <its flags>`."""
    return shlex.join(["bert-jax", command, *sys.argv[1:]])


def _library_and_pipeline(out: str) -> tuple[str, str | None]:
    """(library_name, pipeline_tag) of what `out` holds: a sentence-transformers folder, a transformers folder (its
    architectures' head), or a folder only bert_jax reads (a params export, an averaged run)."""
    folder = paths.path(out)
    if (folder / SENTENCE_TRANSFORMERS_FILE).exists():
        return "sentence-transformers", "sentence-similarity"
    hf_config = folder / "config.json"
    architectures = json.loads(hf_config.read_text()).get("architectures") if hf_config.exists() else None
    if not architectures:
        return LIBRARY, None
    return "transformers", _pipeline_tag(architectures[0])


def _pipeline_tag(architecture: str) -> str | None:
    """The Hub's pipeline tag of transformers' `architecture` (PIPELINE_TAGS by its head); a ForPreTraining class
    without a vocabulary decoder (no output layer tied to the word embeddings) fills no mask: no tag."""
    head = next((suffix for suffix in PIPELINE_TAGS if architecture.endswith(suffix)), None)
    if head == "ForPreTraining" and not _predicts_tokens(architecture):
        return None
    return PIPELINE_TAGS.get(head)


def _predicts_tokens(architecture: str) -> bool:
    """Whether transformers' class `architecture` has a vocabulary decoder: it declares an output layer tied to the
    word embeddings (BertForPreTraining's and AlbertForPreTraining's MLM heads do; ElectraForPreTraining declares
    none). Asked of the class, so the card stays free of family names."""
    import transformers  # only for a transformers folder, which its export has already built

    return bool(getattr(getattr(transformers, architecture, None), "_tied_weights_keys", None))


def _data_sources(data: dict) -> dict[str, str]:
    """{source name: what it reads}: a mixture's sources by their names; a single source by its path or TFDS name."""
    def reads(cfg: dict) -> str:
        return cfg.get("tfds_name") or cfg.get("path") or cfg.get("source", "")

    def said(kind: str, where: str) -> str:
        return f"{kind} source" + (f", `{where}`" if where and where != kind else "")

    if data.get("mixture"):
        return {name: said(spec.get("source", ""), reads({**data, **spec}))
                for name, spec in sorted(data["mixture"].items())}
    if "train" in data and "source" not in data:  # a fine-tuning run's data: its train split
        where = data.get("tfds_name") or data.get("train", "")
        return {str(where).rstrip("/").rsplit("/", 1)[-1] or "train": said(data.get("format", ""), where)}
    return {str(reads(data)).rstrip("/").rsplit("/", 1)[-1] or "data": said(data.get("source", ""), reads(data))}


def _mixture_lines(config) -> list[str]:
    """A mixture's weights by stage (and its sources' sizes, for weights taken from them), as markdown lines."""
    names = mixture.source_names(config.data)
    out = []
    if mixture.by_temperature(config.data):
        sizes = ", ".join(f"{name} {size:,}" for name, size in zip(names, mixture.sizes(config.data)))
        alphas = [config.data.mixture_alpha, *(a for _, a in config.data.get("mixture_alpha_schedule", ()) or ())]
        out.append(f"- sampled by temperature, p ~ size ** alpha (alpha {' then '.join(f'{a:g}' for a in alphas)}); "
                   f"sizes: {sizes}")
    for step, weights in mixture.stages(config.data):
        shares = ", ".join(f"{name} {w:.3f}" for name, w in zip(names, weights))
        out.append(f"- from step {step}: {shares}")
    return out


def _eval_row(workdir: str, step: int | None) -> dict:
    """The last eval row of metrics.jsonl at or before `step` ({} when the run never evaluated)."""
    rows = metrics_file.read_rows(Workdir(workdir).metrics_jsonl)
    evals = [r for r in rows if "eval/loss" in r and (step is None or r.get("step", 0) <= step)]
    return evals[-1] if evals else {}


def _final_metrics(workdir: str, config, step: int | None) -> tuple[dict[str, float], str]:
    """({metric: value}, where they come from) of the run's final evaluation: a pre-training run's last eval row
    (eval/*), a fine-tuned run's results.json (validation/*, test/*)."""
    run = Workdir(workdir)
    if "task" in config and run.results_json.exists():
        results = json.loads(run.results_json.read_text())
        metrics = {f"{split}/{k}": float(v) for split in ("validation", "test")
                   for k, v in (results.get(split) or {}).items() if isinstance(v, (int, float))}
        return metrics, f"results.json of {workdir}"
    row = _eval_row(workdir, step)
    metrics = {k: float(v) for k, v in row.items() if k.startswith("eval/") and isinstance(v, (int, float))}
    return metrics, (f"the eval at step {row['step']} (metrics.jsonl of {workdir})" if row else "")


def _tokens(config, step: int) -> int | None:
    """Sequence positions trained on up to `step` (padding included): batch x length of each stage, by its steps."""
    try:
        planned = stages.plan(config)
    except (ValueError, KeyError, AttributeError):  # an older config the stage planner no longer reads
        return None
    return counters.tokens_seen(step, counters.token_spans(planned, config))


def _num_params(workdir: str, step: int | None, params: dict | None) -> int:
    """The parameters of `params`, or (None) of the run's checkpoint at `step`, read from its orbax metadata."""
    tree = params if params is not None else state_metadata(Workdir(workdir), step)["params"]
    return int(sum(np.prod(getattr(leaf, "shape", None) or np.shape(leaf)) for leaf in _leaves(tree)))


def _leaves(tree):
    if isinstance(tree, dict) or hasattr(tree, "items"):
        for value in tree.values():
            yield from _leaves(value)
    else:
        yield tree


def _lineage_lines(workdir: str, config) -> list[str]:
    out = [f"- {line}" for line in lineage.lines(workdir)]  # a branch's ancestors, an average's sources
    if config.get("grow_from"):
        out.append(f"- grown from {config.grow_from} (config.grow_from)")
    if config.get("init_from_hf"):
        out.append(f"- initialised from {config.init_from_hf} (config.init_from_hf)")
    if config.get("init_from"):
        out.append(f"- fine-tuned from {config.init_from} (config.init_from)")
    return out or ["- trained from scratch"]


def _objective_lines(config) -> list[str]:
    """What the run was trained to predict: its masking, or its objective stage by stage where it names one (a causal
    run, a biphasic run's causal then masked phases)."""
    masking = (f"Masking: rate {config.data.get('mask_rate')}, sequences of {config.data.get('max_seq_length')} "
               "tokens.")
    planned = stages.plan(config)
    named = [(s.start + 1, s.end, s.config.model.get("objective", "")) for s in planned]
    if not any(objective for _, _, objective in named):
        return [masking]
    spans = ", ".join(f"`{objective or 'its own'}` steps {start}-{end}" for start, end, objective in named)
    return [f"Objective (config.model.objective) by stage: {spans}.",
            *([masking] if not all(is_causal(s.config.model) for s in planned) else [])]


def card_text(workdir: str, out: str, step: int | None, command: str, params: dict | None = None) -> str:
    """The model card of the run in `workdir` at `step` (None: a fine-tuning run not finished), exported to `out`,
    as README.md's text."""
    run = Workdir(workdir)
    config = run.config()
    recorded = json.loads(run.config_json.read_text())
    m = config.model
    name = str(out).rstrip("/").rsplit("/", 1)[-1]
    library, pipeline_tag = _library_and_pipeline(out)
    metrics, where = _final_metrics(workdir, config, step)
    sources = _data_sources(recorded.get("data", {}))
    task_kind = config.task.kind if "task" in config else None
    eval_task = pipeline_tag or "fill-mask"
    dataset = ", ".join(sources)
    results = [EvalResult(task_type=eval_task, dataset_type=next(iter(sources)), dataset_name=dataset,
                          dataset_split="validation" if task_kind else "eval", metric_type=key.rsplit("/", 1)[-1],
                          metric_name=key, metric_value=round(value, 6))
               for key, value in metrics.items()]
    tags = [LIBRARY, m.family, "fine-tuned" if task_kind else "pretraining", *([task_kind] if task_kind else [])]
    data = ModelCardData(library_name=library, pipeline_tag=pipeline_tag, license=config.get("license") or
                         UNKNOWN_LICENSE, tags=tags, datasets=list(sources), model_name=name,
                         eval_results=results or None)
    num_params = _num_params(workdir, step, params)
    tokens = _tokens(config, step) if step is not None and not task_kind else None
    identity = recorded.get("run_identity") or {}
    commit = (identity.get("git_commit") or {}).get("commit")
    body = [
        f"# {name}", "",
        f"A {m.family} encoder{f' fine-tuned for {task_kind}' if task_kind else ''}, {num_params:,} parameters "
        f"({m.get('num_layers')} layers, hidden size {m.get('hidden_size')}, {m.get('num_heads')} heads, vocabulary "
        f"{m.get('vocab_size')}), trained with bert_jax and exported from `{workdir}`"
        f"{f' at step {step}' if step is not None else ''}.", "",
        "## Data", "",
        *[f"- `{source}`: {reads}" for source, reads in sources.items()],
        *(["", "Mixture weights by stage (the shares realised are `data/<name>/fraction` in metrics.jsonl):", "",
           *_mixture_lines(config)] if mixture.has_mixture(config.data) else []),
        *(["", *_objective_lines(config)] if not task_kind else []),
        "", "## Training", "",
        f"- steps: {step if step is not None else 'unfinished'}"
        f"{f' of {config.train.num_steps}' if config.train.get('num_steps') else ''}",
        *([f"- tokens: {tokens:,} (sequence positions, padding included: batch x length of each stage)"]
          if tokens is not None else []),
        f"- global batch {config.train.get('global_batch_size')}, optimizer {config.train.get('optimizer')}, "
        f"learning rate {config.train.get('learning_rate')} ({config.train.get('schedule', 'linear')} schedule)",
        "", "## Lineage", "",
        *_lineage_lines(workdir, config),
        "", "## Evaluation", "",
        *([f"Final metrics, {where}:", "", "| metric | value |", "|---|---|",
           *[f"| {key} | {value:.4f} |" for key, value in metrics.items()]] if metrics else
          ["Not evaluated: this run logged no eval (an averaged run is evaluated by `bert-jax evaluate`)."]),
        "", "## How it was made", "",
        "```bash", command, "```", "",
        f"from the run in `{workdir}`, whose resolved config is its `config.json` (config digest "
        f"`{lineage.digest(recorded)}`{f', code commit `{commit}`' if commit else ''}).",
    ]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body) + "\n").content


def write_card(workdir: str, out: str, step: int | None, command: str, params: dict | None = None) -> str:
    """Writes OUT/README.md (card_text); returns its path. `params`: the exported tree, to count (default: the
    params of the run's checkpoint at `step`)."""
    target = paths.path(out) / CARD_FILE
    paths.write_atomically(target, card_text(workdir, out, step, command, params))
    return str(target)
