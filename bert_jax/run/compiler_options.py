"""XLA options the train and eval steps compile with, per target platform: measured choices only.

NVIDIA GPU: `xla_gpu_enable_triton_gemm=False` sends every matmul to cuBLAS instead of XLA's
Triton GEMM fusions. On one H200 it gave +4 % tokens/s at BERT-base (128, 256) and at
BERT-large (512, 32), A/B in the same interleaved rounds (bench/accelerator_throughput.py
--jax_variants, 2026-11-26; docs/results/gpu.md), and +3 % on an H100 on 2026-11-22.
"""

_BY_PLATFORM: dict[str, dict[str, bool | int | float | str]] = {
    "gpu": {"xla_gpu_enable_triton_gemm": False},
}


def compiler_options(platform: str) -> dict | None:
    """The options for `jax.jit(..., compiler_options=...)` on `platform` ('gpu', 'tpu', 'cpu', ...), or None."""
    return dict(_BY_PLATFORM[platform]) if platform in _BY_PLATFORM else None
