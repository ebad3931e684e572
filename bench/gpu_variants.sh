#!/usr/bin/env bash
# Issue 54 in one call of at most 9 minutes on a lent GPU: bert_jax's default and each speed variant beside
# HF eager and torch.compile, the sides interleaved round by round (bench/accelerator_throughput.py), one
# JSON line per shape in $OUT/gpu_variants.jsonl (and the step anatomy of the GPU compile in $OUT/anatomy.json).
#
#   bash bench/gpu_variants.sh                                      # on the GPU, from the project's root
#   SHAPES=mini:32:4 VARIANT_SHAPES='mini:32:4' SIDES=bert_jax,hf_eager STEPS=1 ROUNDS=1 WARMUP=1 \
#     BUDGET_S=0 ANATOMY=0 OUT=/tmp/v bash bench/gpu_variants.sh    # end to end on a CPU (tests/test_gpu_variants.py)
#
# The variants are config keys (docs/results/gpu.md): the dropout PRNG (train.dropout_prng), every layer's
# dropout masks in one draw (model.dropout_masks), Adam over one flat buffer (train.flat_moments), the layer
# scan rolled by 2 or 4 layers per iteration (model.scan_unroll; the GPU default runs the stack unrolled,
# model.unroll_on_gpu), and issue 66's levers on and off: the rolled scan of before (rolled), post-LN's fused
# dropout-add-norm (fused_norm), query/key/value as one matmul (fused_qkv). They run at the two shapes of the
# acceptance bar; the other shapes run the default and the HF sides only. Shapes start while BUDGET_S seconds
# are not spent, in the order below (the acceptance shapes first). First, bench/gpu_kernel_checks.py: the GPU
# defaults against the reference path on this device (values, gradients, dropout masks), $OUT/kernel_checks.json.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_variants}
mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c "import grain, ml_collections" 2>/dev/null; then  # the GPU image's missing wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
SHAPES=${SHAPES:-base:128:256,large:512:32,modernbert_base:1024:32,large:128:256,deberta_v3_base:512:32}
VARIANT_SHAPES=${VARIANT_SHAPES:-base:128:256|large:512:32}
VARIANTS=${VARIANTS:-}  # given: only these (name:key=value+...@shape|shape, comma-separated)
if [ -z "$VARIANTS" ]; then
VARIANTS="rbg:train.dropout_prng=rbg@$VARIANT_SHAPES"
VARIANTS+=",unsafe_rbg:train.dropout_prng=unsafe_rbg@$VARIANT_SHAPES"
VARIANTS+=",masks_per_step:model.dropout_masks=per_step@$VARIANT_SHAPES"
VARIANTS+=",flat_adam:train.flat_moments=true@$VARIANT_SHAPES"
VARIANTS+=",unroll2:model.scan_unroll=2@$VARIANT_SHAPES"
VARIANTS+=",unroll4:model.scan_unroll=4@$VARIANT_SHAPES"
VARIANTS+=",rolled:model.unroll_on_gpu=false@$VARIANT_SHAPES"
VARIANTS+=",fused_norm:model.fused_dropout_norm=true@$VARIANT_SHAPES"
VARIANTS+=",fused_qkv:model.fused_qkv=true@$VARIANT_SHAPES"
VARIANTS+=",all:train.dropout_prng=unsafe_rbg+train.flat_moments=true+model.scan_unroll=2@$VARIANT_SHAPES"
fi
if [ "${KERNEL_CHECKS:-1}" = 1 ]; then  # exit status 1 (and the script stops) if the GPU defaults compute otherwise
  python3 bench/gpu_kernel_checks.py ${KERNEL_CHECK_FLAGS:-} | tee "$OUT/kernel_checks.json"
fi
python3 bench/accelerator_throughput.py --shapes="$SHAPES" --jax_variants="$VARIANTS" \
  --sides="${SIDES:-bert_jax,hf_eager,hf_compile}" --steps="${STEPS:-3}" --rounds="${ROUNDS:-3}" \
  --warmup="${WARMUP:-2}" --packing_shape= --budget_s="${BUDGET_S:-330}" \
  --jsonl="$OUT/gpu_variants.jsonl" --out="$OUT/gpu_variants.json"
if [ "${ANATOMY:-1}" = 1 ]; then  # kernels and bytes by part, as the GPU compiler emits them (no run)
  python3 bench/step_anatomy.py --shape=128:256 --hlo_dir="$OUT/hlo" --json="$OUT/anatomy.json"
fi
