"""bert_jax/plan/hlo_traffic.py: HBM and on-chip bytes of a compiled program, each counting rule on a small
hand-written module in the TPU compiler's text format (the real compiles are in tests/test_plan_tpu.py)."""
from bert_jax.plan import hlo_traffic

MIB = 2**20
# f32[1024,256] is 1 MiB; S(1) marks on-chip memory (VMEM), no S (or S(0)) HBM.
MODULE = """HloModule jit_step, is_scheduled=true

%fused_slice_inner (param_0.1: f32[4,1024,256]) -> bf16[1024,256] {
  %param_0.1 = f32[4,1024,256]{2,1,0:T(8,128)} parameter(0)
  %slice.1 = f32[1,1024,256]{2,1,0:T(8,128)} slice(%param_0.1), slice={[2:3], [0:1024], [0:256]}
  %bitcast.1 = f32[1024,256]{1,0:T(8,128)} bitcast(%slice.1)
  ROOT %convert.1 = bf16[1024,256]{1,0:T(8,128)(2,1)} convert(%bitcast.1)
}

%fused_matmul (param_0.2: f32[4,1024,256], param_1.2: bf16[8,1024]) -> bf16[8,256] {
  %param_0.2 = f32[4,1024,256]{2,1,0:T(8,128)} parameter(0)
  %fusion.9 = bf16[1024,256]{1,0:T(8,128)(2,1)} fusion(%param_0.2), kind=kLoop, calls=%fused_slice_inner
  %param_1.2 = bf16[8,1024]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %dot.1 = bf16[8,256]{1,0:T(8,128)(2,1)} dot(%param_1.2, %fusion.9), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_update (param_0.3: f32[4,1024,256], param_1.3: f32[1024,256], param_2.3: s32[]) -> f32[4,1024,256] {
  %param_0.3 = f32[4,1024,256]{2,1,0:T(8,128)} parameter(0)
  %param_1.3 = f32[1024,256]{1,0:T(8,128)S(1)} parameter(1)
  %bitcast.3 = f32[1,1024,256]{2,1,0:T(8,128)S(1)} bitcast(%param_1.3)
  %param_2.3 = s32[]{:T(128)} parameter(2)
  %dynamic-update-slice.1 = f32[4,1024,256]{2,1,0:T(8,128)} dynamic-update-slice(%param_0.3, %bitcast.3, %param_2.3, %param_2.3, %param_2.3)
  ROOT %bitcast.4 = f32[4,1024,256]{2,1,0:T(8,128)} bitcast(%dynamic-update-slice.1)
}

%body (loop_param: (s32[], f32[1024,256])) -> (s32[], f32[1024,256]) {
  %loop_param = (s32[]{:T(128)}, f32[1024,256]{1,0:T(8,128)}) parameter(0)
  %get-tuple-element.7 = f32[1024,256]{1,0:T(8,128)} get-tuple-element(%loop_param), index=1
  %negate.1 = f32[1024,256]{1,0:T(8,128)} negate(%get-tuple-element.7)
  %get-tuple-element.8 = s32[]{:T(128)} get-tuple-element(%loop_param), index=0
  ROOT %tuple.2 = (s32[]{:T(128)}, f32[1024,256]{1,0:T(8,128)}) tuple(%get-tuple-element.8, %negate.1)
}

%condition (cond_param: (s32[], f32[1024,256])) -> pred[] {
  %cond_param = (s32[]{:T(128)}, f32[1024,256]{1,0:T(8,128)}) parameter(0)
  ROOT %constant.9 = pred[]{:T(512)} constant(true)
}

ENTRY %main (param.1: f32[4,1024,256], param.2: bf16[8,1024], param.3: f32[1024,256], param.4: s32[]) -> f32[4,1024,256] {
  %param.1 = f32[4,1024,256]{2,1,0:T(8,128)} parameter(0)
  %param.2 = bf16[8,1024]{1,0:T(8,128)(2,1)} parameter(1)
  %param.3 = f32[1024,256]{1,0:T(8,128)} parameter(2)
  %param.4 = s32[]{:T(128)} parameter(3)
  %copy-start.1 = (f32[1024,256]{1,0:T(8,128)S(1)}, f32[1024,256]{1,0:T(8,128)}, u32[]{:S(2)}) copy-start(%param.3)
  %copy-done.1 = f32[1024,256]{1,0:T(8,128)S(1)} copy-done(%copy-start.1)
  %slice-start.1 = ((f32[4,1024,256]{2,1,0:T(8,128)}), f32[1,1024,256]{2,1,0:T(8,128)S(1)}, s32[]{:S(2)}) slice-start(%param.1), slice={[0:1], [0:1024], [0:256]}
  %slice-done.1 = f32[1,1024,256]{2,1,0:T(8,128)S(1)} slice-done(%slice-start.1)
  %fusion.1 = bf16[8,256]{1,0:T(8,128)(2,1)S(1)} fusion(%param.1, %param.2), kind=kOutput, calls=%fused_matmul
  %fusion.2 = f32[4,1024,256]{2,1,0:T(8,128)} fusion(%param.1, %copy-done.1, %param.4), kind=kLoop, calls=%fused_update
  %tuple.1 = (s32[]{:T(128)}, f32[1024,256]{1,0:T(8,128)}) tuple(%param.4, %param.3)
  %while.1 = (s32[]{:T(128)}, f32[1024,256]{1,0:T(8,128)}) while(%tuple.1), condition=%condition, body=%body, metadata={op_name="jit(step)/while"}, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %bitcast.9 = f32[4,1024,256]{2,1,0:T(8,128)} bitcast(%fusion.2)
}
"""


def test_each_rule_counts_the_bytes_that_cross_each_memory():
    traffic = hlo_traffic.traffic(MODULE)
    hbm = (
        1 * MIB  # copy-start: reads its HBM source once (its done, nothing)
        + 1 * MIB  # slice-start: reads the 1 MiB it takes of the 4 MiB buffer
        + 1 * MIB + 16 * 1024  # the matmul fusion reads one sliced layer and its [8, 1024] bf16 input
        + 1 * MIB + 4  # the in-place update writes one layer of the stacked buffer (reads none of it) at an s32 index
        + 3 * 2 * MIB  # the while body, 3 trips, reads and writes 1 MiB each
    )
    on_chip = (
        1 * MIB  # copy-start's destination
        + 1 * MIB  # slice-start's destination
        + 8 * 256 * 2  # the matmul's result stays on chip
        + 1 * MIB  # the update is read from on chip
    )
    assert (traffic.hbm, traffic.on_chip, traffic.loops_counted_once) == (hbm, on_chip, 0)


def test_launches_and_parts_add_up_to_the_whole_counting_a_loops_trips():
    """What `plan --gpu` reports as kernel launches and `bench/step_anatomy.py` splits by part: every instruction
    that moves data, a loop's body once per trip; the parts' bytes sum to the program's."""
    traffic = hlo_traffic.traffic(MODULE)
    once = hlo_traffic.traffic(MODULE.replace(', backend_config={"known_trip_count":{"n":"3"}}', ""))
    assert traffic.launches - once.launches == 2 * (once.launches - hlo_traffic.traffic(MODULE.replace(
        ', backend_config={"known_trip_count":{"n":"3"}}', ', backend_config={"known_trip_count":{"n":"0"}}')).launches)
    parts = hlo_traffic.breakdown(MODULE, lambda opcode, op_name: opcode)
    assert sum(k for k, _, _ in parts.values()) == traffic.launches
    assert sum(h for _, h, _ in parts.values()) == traffic.hbm and sum(o for _, _, o in parts.values()) == traffic.on_chip


def test_a_loop_without_a_known_trip_count_is_counted_once_and_said():
    once = hlo_traffic.traffic(MODULE.replace(', backend_config={"known_trip_count":{"n":"3"}}', ""))
    assert once.loops_counted_once == 1
    assert hlo_traffic.traffic(MODULE).hbm - once.hbm == 2 * 2 * MIB


# A scanned layer loop as the TPU compiler emits it: no known_trip_count, a condition `counter < 5`, a body
# adding 1 to (a copy of) the counter, and a start copied from the constant 2: 3 trips.
COUNTED_BODY = """%body (loop_param: (s32[], f32[1024,256])) -> (s32[], f32[1024,256]) {
  %loop_param = (s32[]{:T(128)}, f32[1024,256]{1,0:T(8,128)}) parameter(0)
  %get-tuple-element.7 = f32[1024,256]{1,0:T(8,128)} get-tuple-element(%loop_param), index=1
  %negate.1 = f32[1024,256]{1,0:T(8,128)} negate(%get-tuple-element.7)
  %get-tuple-element.8 = s32[]{:T(128)} get-tuple-element(%loop_param), index=0
  %constant.1 = s32[]{:T(128)} constant(1)
  %copy.9 = s32[]{:T(128)} copy(%get-tuple-element.8)
  %add.1 = s32[]{:T(128)} add(%copy.9, %constant.1)
  ROOT %tuple.2 = (s32[]{:T(128)}, f32[1024,256]{1,0:T(8,128)}) tuple(%add.1, %negate.1)
}

%condition (cond_param: (s32[], f32[1024,256])) -> pred[] {
  %cond_param = (s32[]{:T(128)}, f32[1024,256]{1,0:T(8,128)}) parameter(0)
  %constant.8 = s32[]{:T(128)} constant(5)
  %get-tuple-element.9 = s32[]{:T(128)} get-tuple-element(%cond_param), index=0
  ROOT %lt.1 = pred[]{:T(512)} compare(%get-tuple-element.9, %constant.8), direction=LT
}
"""


def counted_loop_module(step: int = 1) -> str:
    start, end = MODULE.index("%body ("), MODULE.index("ENTRY ")
    module = MODULE[:start] + COUNTED_BODY.replace("constant(1)", f"constant({step})") + "\n" + MODULE[end:]
    return module.replace(', backend_config={"known_trip_count":{"n":"3"}}', "").replace(
        "  %tuple.1 = (s32[]{:T(128)}, f32[1024,256]{1,0:T(8,128)}) tuple(%param.4, %param.3)",
        "  %constant.2 = s32[]{:T(128)} constant(2)\n  %copy.2 = s32[]{:T(128)} copy(%constant.2)\n"
        "  %tuple.1 = (s32[]{:T(128)}, f32[1024,256]{1,0:T(8,128)}) tuple(%copy.2, %param.3)")


def test_a_counted_loop_without_a_trip_count_has_it_read_from_its_condition_body_and_start():
    counted = hlo_traffic.traffic(counted_loop_module())
    assert counted.loops_counted_once == 0 and counted.innermost_trips == (3,)
    # The same 3 trips, plus the counter: its start's copy (reads and writes 4 bytes), and per trip a copy and an add
    # (8 and 12 bytes).
    assert counted.hbm == hlo_traffic.traffic(MODULE).hbm + 8 + 3 * (8 + 12)
    # A windowed einsum's loop steps by 2: ceil((5 - 2) / 2) trips. Made by the compiler (named for its dot, not
    # a program's /while), it is not a layer loop.
    windowed = counted_loop_module(step=2).replace('op_name="jit(step)/while"', 'op_name="jit(step)/dot_general"')
    stepping_by_two = hlo_traffic.traffic(windowed)
    assert stepping_by_two.loops_counted_once == 0 and stepping_by_two.innermost_trips == ()
    assert stepping_by_two.compiler_loop_trips == (2,) and counted.compiler_loop_trips == ()  # a FLOPs ceiling's factor
    assert stepping_by_two.hbm == counted.hbm - 2 * MIB - 20  # one trip fewer
    stepping_down = hlo_traffic.traffic(counted_loop_module(step=-1))  # not the form it reads: counted once, said
    assert stepping_down.loops_counted_once == 1 and stepping_down.innermost_trips == ()


# Around scanned layers the TPU compiler relayouts a stacked buffer in place (a nested copy fusion aliasing its
# operand) before slicing it or updating a layer of it, and allocates the stacked buffers with a custom call.
ALIASED = """HloModule jit_step, is_scheduled=true

%copy_fusion (input: f32[4,1024,256]) -> f32[4,1024,256] {
  %input = f32[4,1024,256]{2,1,0:T(8,128)} parameter(0)
  ROOT %copy.1 = f32[4,1024,256]{2,1,0:T(2,128)} copy(%input)
}

%fused_read (param_0.1: f32[4,1024,256], param_1.1: s32[]) -> f32[1,1024,256] {
  %param_0.1 = f32[4,1024,256]{2,1,0:T(8,128)} parameter(0)
  %fusion.7 = f32[4,1024,256]{2,1,0:T(2,128)} fusion(%param_0.1), kind=kLoop, output_to_operand_aliasing={{}: (0, {})}, calls=%copy_fusion
  %param_1.1 = s32[]{:T(128)} parameter(1)
  ROOT %dynamic-slice.1 = f32[1,1024,256]{2,1,0:T(2,128)} dynamic-slice(%fusion.7, %param_1.1, %param_1.1, %param_1.1), dynamic_slice_sizes={1,1024,256}
}

%fused_write (param_0.2: f32[4,1024,256], param_1.2: f32[1,1024,256], param_2.2: s32[]) -> f32[4,1024,256] {
  %param_0.2 = f32[4,1024,256]{2,1,0:T(8,128)} parameter(0)
  %fusion.8 = f32[4,1024,256]{2,1,0:T(2,128)} fusion(%param_0.2), kind=kLoop, output_to_operand_aliasing={{}: (0, {})}, calls=%copy_fusion
  %param_1.2 = f32[1,1024,256]{2,1,0:T(8,128)} parameter(1)
  %param_2.2 = s32[]{:T(128)} parameter(2)
  ROOT %dynamic-update-slice.1 = f32[4,1024,256]{2,1,0:T(2,128)} dynamic-update-slice(%fusion.8, %param_1.2, %param_2.2, %param_2.2, %param_2.2)
}

ENTRY %main (param.1: f32[4,1024,256], param.2: s32[]) -> f32[4,1024,256] {
  %param.1 = f32[4,1024,256]{2,1,0:T(8,128)} parameter(0)
  %param.2 = s32[]{:T(128)} parameter(1)
  %custom-call.1 = f32[4,1024,256]{2,1,0:T(8,128)} custom-call(), custom_call_target="AllocateBuffer"
  %fusion.1 = f32[1,1024,256]{2,1,0:T(8,128)} fusion(%param.1, %param.2), kind=kLoop, calls=%fused_read
  ROOT %fusion.2 = f32[4,1024,256]{2,1,0:T(8,128)} fusion(%custom-call.1, %fusion.1, %param.2), kind=kLoop, calls=%fused_write
}
"""


def test_an_in_place_relayout_and_an_allocation_move_nothing():
    traffic = hlo_traffic.traffic(ALIASED)
    # The read takes one 1 MiB layer and writes it; the write reads that layer and writes it into one layer of
    # the allocated buffer; each reads the s32 index.
    assert (traffic.hbm, traffic.on_chip) == (4 * MIB + 2 * 4, 0)


# An embedding lookup as the TPU compiler fuses it (DeBERTa-v3's word table, here 8 MiB of f32): the fusion gathers
# 1024 rows of 256 into bf16; a gather outside a fusion reads its rows the same way.
GATHER = """HloModule jit_step, is_scheduled=true

%fused_lookup (param_0.1: f32[8192,256], param_1.1: s32[1024]) -> bf16[1024,256] {
  %param_0.1 = f32[8192,256]{1,0:T(8,128)} parameter(0)
  %param_1.1 = s32[1024]{0:T(1024)} parameter(1)
  ROOT %gather.1 = bf16[1024,256]{1,0:T(8,128)(2,1)} gather(%param_0.1, %param_1.1), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,256}
}

ENTRY %main (param.1: f32[8192,256], param.2: s32[1024]) -> (bf16[1024,256], f32[1024,256]) {
  %param.1 = f32[8192,256]{1,0:T(8,128)} parameter(0)
  %param.2 = s32[1024]{0:T(1024)} parameter(1)
  %fusion.1 = bf16[1024,256]{1,0:T(8,128)(2,1)} fusion(%param.1, %param.2), kind=kLoop, calls=%fused_lookup
  %gather.2 = f32[1024,256]{1,0:T(8,128)} gather(%param.1, %param.2), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,256}
  ROOT %tuple.1 = (bf16[1024,256]{1,0:T(8,128)(2,1)}, f32[1024,256]{1,0:T(8,128)}) tuple(%fusion.1, %gather.2)
}
"""


def test_an_embedding_lookup_reads_the_rows_it_gathers_not_the_table():
    traffic = hlo_traffic.traffic(GATHER)
    # Each reads 1024 f32 rows of 256 (1 MiB) and the 4 kB of indices; the fusion writes them in bf16, the gather f32.
    assert traffic.hbm == 2 * (MIB + 1024 * 4) + MIB / 2 + MIB


# An embedding table's gradient as the TPU compiler builds it (the transpose of a lookup into an 8 MiB f32 table):
# a zeroed table, then a scatter fusion adding 1024 rows of 256 into it in place; a scatter outside a fusion the
# same way. The updates sit in on-chip memory, as the compiler places them.
SCATTER = """HloModule jit_step, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%fused_scatter (param_0.1: f32[8192,256], param_1.1: s32[1024], param_2.1: f32[1024,256]) -> f32[8192,256] {
  %param_0.1 = f32[8192,256]{1,0:T(8,128)} parameter(0)
  %param_1.1 = s32[1024]{0:T(1024)S(1)} parameter(1)
  %param_2.1 = f32[1024,256]{1,0:T(8,128)S(1)} parameter(2)
  %bitcast.1 = f32[1024,256]{1,0:T(8,128)} bitcast(%param_2.1)
  ROOT %scatter.1 = f32[8192,256]{1,0:T(8,128)} scatter(%param_0.1, %param_1.1, %bitcast.1), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
}

ENTRY %main (param.1: s32[1024], param.2: f32[1024,256], param.3: f32[8192,256]) -> (f32[8192,256], f32[8192,256]) {
  %param.1 = s32[1024]{0:T(1024)S(1)} parameter(0)
  %param.2 = f32[1024,256]{1,0:T(8,128)S(1)} parameter(1)
  %param.3 = f32[8192,256]{1,0:T(8,128)} parameter(2)
  %constant.1 = f32[]{:T(128)} constant(0)
  %broadcast.1 = f32[8192,256]{1,0:T(8,128)} broadcast(%constant.1), dimensions={}
  %fusion.1 = f32[8192,256]{1,0:T(8,128)} fusion(%broadcast.1, %param.1, %param.2), kind=kCustom, calls=%fused_scatter
  %scatter.2 = f32[8192,256]{1,0:T(8,128)} scatter(%param.3, %param.1, %param.2), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  ROOT %tuple.1 = (f32[8192,256]{1,0:T(8,128)}, f32[8192,256]{1,0:T(8,128)}) tuple(%fusion.1, %scatter.2)
}
"""


def test_an_embedding_gradient_reads_and_writes_the_rows_it_scatters_not_the_table():
    traffic = hlo_traffic.traffic(SCATTER)
    # The zero fill writes the whole 8 MiB table (and reads its f32 scalar). Each scatter reads and writes the
    # table at the updates' size (1024 f32 rows of 256: 1 MiB), not 8 MiB each way, and reads the updates (1 MiB)
    # and indices (4 kB) on chip.
    assert traffic.hbm == 8 * MIB + 4 + 2 * (MIB + MIB)
    assert traffic.on_chip == 2 * (MIB + 1024 * 4)
