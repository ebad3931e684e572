"""The part each parameter of a family's module plays, declared by the family (bert_jax.families).

Tools that treat parameters by what they are read it here instead of guessing from names: the FLOP
formula leaves the lookup tables out (bert_jax.train.perf), layer-wise learning-rate decay and freezing
need a depth (bert_jax.finetune.optimizer), fine-tuning asks whether there is a pooler. A parameter
whose path matches no declared role fails loudly, naming it and the family, rather than silently
getting the top rate.

A path's keys are read outermost first and the first one a role names decides (patterns as fnmatch's):
`embeddings` are depth 0; `single_layers` (layers outside the stack, in order: ModernBERT's first)
depths 1, 2, ...; the stack's unrolled `layers_i` the next depth + i, its scanned `layers` one depth per
row of the leading axis; `top` (pooler, pre-training heads, final norms, a generator) num_layers + 1.
"""
import dataclasses
import fnmatch
import re

import numpy as np


@dataclasses.dataclass(frozen=True)
class ParamRoles:
    # Lookup tables (and the tied decoder's bias): no matmul FLOPs per token; a leaf naming one is left out of N.
    embedding_tables: tuple[str, ...] = ("word", "position", "token_type", "mlm_output_bias")
    embeddings: tuple[str, ...] = ("embeddings",)
    single_layers: tuple[str, ...] = ()
    stack: str = "layers"
    top: tuple[str, ...] = ("mlm_transform", "mlm_norm", "mlm_output_bias")
    # The submodule whose tanh(dense([CLS])) is `encode`'s "pooled"; None: the family has no pooler.
    pooler: str | None = None
    # Layer groups whose one set of parameters serves several depths (ALBERT's group_*): the FLOP formula
    # counts a leaf under one of G matching groups num_layers / G times.
    shared_layers: tuple[str, ...] = ()
    # μP (bert_jax/models/parametrization.py). The config.model keys that grow with the width (doubled to find each
    # parameter's width axes); the norms that feed a tied decoder, which carry μP's output multiplier; the query
    # projection(s), where an export folds the attention-logit multiplier, with (axis, index) of a fused QKV's
    # query slice (None: the whole leaf).
    width_keys: tuple[str, ...] = ("hidden_size", "intermediate_size")
    readout_inputs: tuple[str, ...] = ("mlm_norm",)
    query: tuple[str, ...] = ("query",)
    query_slice: tuple[int, int] | None = None

    def depth(self, path: tuple[str, ...], shape: tuple[int, ...], num_layers: int, family: str):
        """The depth of one parameter: an int, or an int array [rows] for a scanned stack's leaf.

        path: its keys from the module's root; shape: its shape (a scanned stack's rows on axis 0)."""
        stack_start = len(self.single_layers) + 1
        unrolled = re.compile(rf"^{re.escape(self.stack)}_(\d+)$")
        for name in path:
            if self._matches(name, self.embeddings):
                return 0
            if name in self.single_layers:
                return self.single_layers.index(name) + 1
            match = unrolled.match(name)
            if match:
                return stack_start + int(match.group(1))
            if name == self.stack:
                rows = num_layers - len(self.single_layers)
                if not shape or shape[0] != rows:
                    raise ValueError(f"{family}: parameter {'/'.join(path)} of shape {tuple(shape)} is in the "
                                     f"scanned stack {self.stack!r}, whose leading axis should be its {rows} layers")
                return np.arange(stack_start, stack_start + rows)
            if self._matches(name, self.top):
                return num_layers + 1
        raise ValueError(f"{family}: parameter {'/'.join(path)} plays no role the family declares (embeddings "
                         f"{self.embeddings}, layers {self.single_layers + (self.stack,)}, top {self.top}); "
                         f"declare it in the family's ParamRoles (bert_jax/families.py)")

    @staticmethod
    def _matches(name: str, patterns: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)
