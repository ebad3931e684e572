"""What context parallelism (config.mesh.context) asks of a config, checked before anything is built.

The sequence is split by the logical `length` axis (mesh.py's rules map it to the `context` mesh
axis). Global attention layers all-gather keys and values over it or pass them round a ring
(config.mesh.context_attention); windowed ones exchange their neighbours' halo (models/attention.py,
kernels/context_attention.py). The xla kernel does both; splash runs on each device's queries against the
all-gathered keys (bidirectional global layers, all_gather scheme). The other fused kernels (cuDNN, the windowed
Pallas kernel, DeBERTa's fused kernel) see a sequence whole, so they are refused rather than silently gathered whole
on every device.
"""
from bert_jax.kernels.context_attention import SCHEMES
from bert_jax.parallel.mesh import context_size, dcn_shape


def check_context(config, kernel_impl: str) -> None:
    """Raises ValueError in one line naming config.mesh.context (or context_attention) and what to change;
    `kernel_impl` is the attention kernel the config resolves to."""
    context = context_size(config.mesh)
    dcn_shape(config.mesh)  # no context entry across slices: the axis stays inside one
    scheme = config.mesh.get("context_attention", SCHEMES[0])
    if scheme not in SCHEMES:
        raise ValueError(f"config.mesh.context_attention={scheme!r}; expected one of {', '.join(SCHEMES)}")
    if context == 1:
        if scheme != SCHEMES[0]:
            raise ValueError(f"config.mesh.context_attention={scheme!r} does nothing at config.mesh.context=1 (no "
                             f"sequence is split): leave it at {SCHEMES[0]!r}, or set config.mesh.context > 1")
        return
    length = config.data.max_seq_length
    if length % context:
        raise ValueError(f"config.mesh.context={context} does not divide config.data.max_seq_length={length}: "
                         f"each device holds an equal slice of every sequence")
    if kernel_impl == "splash":  # the flash kernel over the all-gathered keys (kernels/context_attention.py)
        if scheme != "all_gather":
            raise ValueError(f"config.mesh.context_attention={scheme!r} passes keys round a ring, which the splash "
                             f"kernel does not: use config.mesh.context_attention=all_gather with splash, or "
                             f"--config.model.attention_impl=xla")
        if (length // context) % 128:
            raise ValueError(f"config.model.attention_impl='splash' at config.mesh.context={context} needs each "
                             f"device's {length // context} tokens of config.data.max_seq_length={length} to be a "
                             f"multiple of 128: change the length, or use --config.model.attention_impl=xla")
    elif kernel_impl != "xla":
        raise ValueError(f"config.mesh.context={context} needs the xla attention kernel, or splash over all-gathered "
                         f"keys on a TPU; attention_impl resolves to {kernel_impl!r} here: use "
                         f"--config.model.attention_impl=xla")
    dropout = config.model.get("attention_dropout_rate", 0.0)
    if scheme == "ring" and dropout > 0:
        raise ValueError(f"config.mesh.context_attention='ring' applies no attention dropout, but "
                         f"config.model.attention_dropout_rate={dropout}: set it to 0, or use all_gather")
    rules = dict(config.mesh.logical_axis_rules) if config.mesh.get("rules", "custom") == "custom" else None
    if rules is not None and "context" not in _axes(rules.get("length")):
        raise ValueError(f"config.mesh.context={context} but config.mesh.logical_axis_rules maps 'length' to "
                         f"{rules.get('length')!r}: map it to 'context', or the axis only repeats the work")


def check_score_bias(config, terms: str) -> None:
    """For a family whose attention adds a [query, key] score bias (`terms`, e.g. DeBERTa-v3's position terms):
    the all-gather splits it exactly (each device's queries against every gathered key, the bias rows of those
    queries); the ring passes only keys and values round, and the family's fused splash kernel sees a sequence
    whole, so both are refused in one line naming the alternative."""
    context = context_size(config.mesh)
    if context > 1 and config.model.get("attention_impl", "auto") == "splash":
        raise ValueError(f"config.model.attention_impl='splash' at config.mesh.context={context}: the fused kernel "
                         f"that adds {terms} sees a sequence whole; use --config.model.attention_impl=xla")
    if context > 1 and config.mesh.get("context_attention", SCHEMES[0]) == "ring":
        raise ValueError(f"config.mesh.context_attention='ring' at config.mesh.context={context} cannot add {terms} "
                         f"to the scores (the ring passes keys and values, not a [query, key] bias): use "
                         f"config.mesh.context_attention=all_gather, which splits them exactly")


def _axes(axes) -> tuple:
    return tuple(axes) if isinstance(axes, (list, tuple)) else (axes,)
