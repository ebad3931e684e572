"""Floating-point comparisons whose tolerance follows from what is compared, not from one CPU's rounding.

The suite compares three kinds of results:

- the same program on the same inputs (a resumed run, a checkpoint, a converter's round trip): these are
  equal bit for bit on whatever machine runs both, so they are compared with `==` / `assert_array_equal`;
- the same maths in another order (remat, scan vs unrolled, sharded vs one device, gradient accumulation):
  `assert_close(actual, desired, REORDERED)`;
- another framework (transformers on torch): `assert_close(ours, theirs, TRANSFORMERS)`.

Reordered float32 sums differ in their last bits, by an amount that scales with the magnitude of what is
summed. Which order runs depends on XLA's kernels for the CPU at hand (vector width, FMA, blocking), so an
element-wise `atol=1e-6` encodes one machine's rounding: a gradient element of 7e-3 that sits next to
elements of 10 may move by 2e-6 on another CPU (issue 11). `assert_close` measures each tensor's error
against that tensor's largest value instead.
"""
import jax
import numpy as np

# float32 rounds each operation to 2**-24 ≈ 6e-8 of its result. A sum of n terms taken in another order
# moves by at most ~n such roundings of its largest term: 1e-5 covers n ≈ 170, more than any reduction in
# these tests' small models (hidden 32-64, 16-32 tokens, vocab 97-128). Measured on AMD EPYC: remat
# gradients 4e-7, scan vs unrolled logits 2e-7, 8-device vs 1-device losses 3e-7, accumulated gradients
# 2e-7. What these comparisons exist to catch moves results by 1e-3 or more: a dropout mask redrawn on
# recomputation, a micro-batch weighted as a whole batch, a remat residual kept in bfloat16 (1e-3, see
# tests/test_numerics.py).
REORDERED = 1e-5

# transformers runs the same maths in PyTorch's kernels (another erf, LayerNorm, matmul blocking), compounded
# through every layer. Measured on AMD EPYC: 3e-7 to 1e-6 of the largest logit for random BERT, RoBERTa and
# ALBERT models, 5e-7 of the largest hidden state for the pre-trained MiniLM; 2e-5 leaves 20x for other
# CPUs and torch builds. The subtlest converter mistake the parity tests guard, tanh-GELU for exact GELU,
# moves the logits of tests/hf_parity.py's random models by 3e-4 to 6e-4 of their largest: 15-30x the bound.
TRANSFORMERS = 2e-5

# A leaf whose largest value is below this fraction of its tree's largest (~8 float32 ulps of it) is what
# cancellation leaves behind, and another summation order redraws it entirely: it is measured against the
# tree's scale, i.e. it must stay negligible. The gradient of an attention key bias is zero in exact
# arithmetic (softmax ignores a constant added to every score): measured 2e-12 (BERT) and 2e-8 (ALBERT) of
# the tree's largest gradient, while the smallest genuine leaves (query/key kernels) sit at 4e-5.
NOISE_FLOOR = 1e-6


def leaf_errors(actual, desired) -> list[tuple[str, float, str]]:
    """(leaf path, max|actual - desired| / scale, the worst element) for each float leaf of two pytrees.

    scale: the leaf's max|desired|; for a leaf below NOISE_FLOOR times the tree's largest |desired|, that largest.
    Pytrees may be arrays, floats, lists or dicts of them. Integer and boolean leaves must be equal, and NaNs
    must sit at the same places.
    """
    actual_leaves, actual_tree = jax.tree.flatten_with_path(actual)
    desired_leaves, desired_tree = jax.tree.flatten_with_path(desired)
    assert actual_tree == desired_tree, f"different structures:\n{actual_tree}\n{desired_tree}"
    pairs = [(jax.tree_util.keystr(path) or "value", np.asarray(a), np.asarray(d))
             for (path, a), (_, d) in zip(actual_leaves, desired_leaves)]
    floats = [d for _, _, d in pairs if np.issubdtype(d.dtype, np.inexact)]
    tree_scale = max((np.nanmax(np.abs(d.astype(np.float64)), initial=0.0) for d in floats), default=0.0)
    errors = []
    for where, a, d in pairs:
        assert a.shape == d.shape, f"{where}: shape {a.shape} != {d.shape}"
        if not np.issubdtype(d.dtype, np.inexact):
            np.testing.assert_array_equal(a, d, err_msg=where)
            continue
        a, d = a.astype(np.float64), d.astype(np.float64)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(d), err_msg=f"{where}: NaNs at other places")
        a, d = np.nan_to_num(a, nan=0.0), np.nan_to_num(d, nan=0.0)
        if a.size == 0:
            continue
        i = np.unravel_index(np.argmax(np.abs(a - d)), d.shape)
        error = abs(a[i] - d[i])
        scale = np.max(np.abs(d))
        scale = scale if scale > NOISE_FLOOR * tree_scale else tree_scale
        ratio = error / scale if scale > 0 else (0.0 if error == 0 else np.inf)
        errors.append((where, ratio, f"{where}{list(map(int, i))}: {a[i]!r} vs {d[i]!r} (scale {scale:.3g})"))
    return errors


def relative_error(actual, desired) -> float:
    """The largest max|actual - desired| / scale over the leaves (see `leaf_errors`): what `assert_close` bounds."""
    return max((ratio for _, ratio, _ in leaf_errors(actual, desired)), default=0.0)


def assert_close(actual, desired, rtol: float, err_msg: str = "") -> float:
    """Asserts max|actual - desired| <= rtol * max|desired| for every leaf of two pytrees (see `leaf_errors`).

    Returns the relative error. On failure, lists the leaves past rtol with their worst element.
    """
    errors = leaf_errors(actual, desired)
    failed = [detail for _, ratio, detail in errors if not ratio <= rtol]
    worst = max((ratio for _, ratio, _ in errors), default=0.0)
    assert not failed, f"{err_msg} relative error {worst:.3g} > rtol {rtol:.3g} in\n  " + "\n  ".join(failed[:10])
    return worst
