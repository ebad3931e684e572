"""Context parallelism (config.mesh.context): a sequence split over devices trains as the whole one does.

The runs happen on 8 simulated CPU devices in a subprocess (tests/context_steps.py): packed rows, several
documents per row, the run with `--config.mesh.context=4` (mesh data=2, context=4) against the same
config without it (data=8), from the same state on the same batches. The attention kernels that cross the axis
without gathering it (the ring, the halo) are checked alone against xla_attention (tests/context_kernels.py).
"""
import pytest
from numerics import REORDERED, assert_close
from test_parallel_mesh import run_parallel_steps

import bert_jax.configs.deberta_v3_xsmall
import bert_jax.configs.modernbert_base
import bert_jax.configs.tiny
from bert_jax.models.targets import building_for
from bert_jax.plan.collectives import mesh_axes
from bert_jax.train.config_validation import validate_config

CONTEXT = 4


def context_steps(args: list[str]) -> dict:
    return run_parallel_steps(args, script="context_steps.py")


def test_modernbert_split_over_the_context_axis_gives_the_same_loss():
    """Micro modernbert (a global layer, a local one whose 4-token window crosses the 8-token shards' edges)."""
    run = context_steps(["--config", "modernbert", "--micro", "--steps=1", f"--context={CONTEXT}"])["modernbert"]
    split = run["split"]["all_gather"]
    assert split["mesh"] == {"data": 2, "fsdp": 1, "context": CONTEXT, "tensor": 1}
    assert "context" in split["attention_gathers_over"]  # the global layer's keys and values gathered over the axis
    assert "context" in split["permutes_over"]  # the local layer's halo from its neighbours
    # The MLM head runs on a device's share of its rows' masked positions, not on all of them (4x the logits).
    assert split["head_rows"] == -(-run["split"]["all_gather"]["predictions"] // CONTEXT), split["head_rows"]
    assert_close(split["context_losses"], run["losses"], REORDERED, "context=4")


def test_ring_and_halo_give_xla_attention_and_its_gradients():
    """Packed segments and a padding tail crossing the shards' edges, on a mesh data=2 x context=4 x tensor=2: the
    ring (bidirectional; causal with a window wider than a shard) and the halo (a window within a shard,
    bidirectional and causal), outputs and the gradients of q, k and v."""
    cases = run_parallel_steps([], env_devices=16, script="context_kernels.py")
    assert len(cases) == 4
    for name, diffs in cases.items():
        assert max(diffs.values()) < 1e-5, (name, diffs)


def test_splash_over_the_gathered_keys_gives_xla_attention_and_its_gradients():
    """Splash (Pallas interpret mode) on each device's queries against the keys all-gathered over context=4, packed
    documents and a padding tail crossing the 128-token shards' edges: the reference's outputs at real tokens and
    its gradients of q, k and v (the keys' through the all-gather's reduce-scatter)."""
    diffs = run_parallel_steps(["--splash"], script="context_kernels.py")["splash_over_gathered"]
    assert max(diffs.values()) < 1e-5, diffs


@pytest.mark.slow  # ~20 s: splash in Pallas interpret mode through a whole model's step
def test_modernbert_with_splash_over_the_context_axis_gives_the_same_loss():
    """Micro modernbert at 512 tokens (128 a device), attention_impl=splash: its global layer over the all-gathered
    keys, its local one by the halo, against the same kernel on whole sequences."""
    run = context_steps(["--config", "modernbert", "--micro", "--splash", "--steps=3", f"--context={CONTEXT}"])
    split = run["modernbert"]["split"]["all_gather"]
    assert "context" in split["attention_gathers_over"] and "context" in split["permutes_over"]
    assert_close(split["context_losses"], run["modernbert"]["losses"], REORDERED, "splash, context=4")


@pytest.mark.slow
def test_acceptance_five_steps_and_a_resume_at_the_configs_tiny_shapes(tmp_path):
    """Issue 77's acceptance: modernbert_base.py:tiny and tiny.py, 5 steps, with the global layers' keys all-gathered
    (killed after 3 and resumed) and passed round a ring."""
    runs = context_steps(["--config", "modernbert", "tiny", *five_steps_and_a_resume(tmp_path)])
    for name, run in runs.items():
        assert_trains_as_the_whole_sequence(name, run)
        assert_ring_trains_as_the_whole_sequence(name, run)


@pytest.mark.slow
def test_replaced_token_detection_and_span_boundaries_train_alike_over_the_context_axis(tmp_path):
    """Issue 77, the sequence's other users: electra_small.py:tiny (the generator's samples put back at the masked
    positions, replaced-token detection over every token, its loss normalised by the real tokens),
    spanbert_base.py:tiny (span masking; each span token predicted from its boundaries' hidden states, gathered
    wherever along the sequence they are) and deberta_v3_xsmall.py:tiny (disentangled attention's position terms
    as a score bias), all on packed rows: 5 steps with the keys all-gathered (killed after 3 and resumed) and, but
    for DeBERTa-v3, whose ring config validation refuses, passed round a ring. One process for the three (compiles
    are the cost)."""
    runs = context_steps(["--config", "electra", "spanbert", "deberta", *five_steps_and_a_resume(tmp_path)])
    assert sorted(runs) == ["deberta", "electra", "spanbert"]
    for name, run in runs.items():
        assert_trains_as_the_whole_sequence(name, run)
    for name in ("electra", "spanbert"):
        assert_ring_trains_as_the_whole_sequence(name, runs[name])
    refusal = runs["deberta"]["split"]["ring"]["refused"]
    assert "\n" not in refusal and "config.mesh.context_attention=all_gather" in refusal, refusal


def five_steps_and_a_resume(checkpoint_dir) -> list[str]:
    return ["--steps=5", f"--context={CONTEXT}", "--save_at=3", f"--checkpoint_dir={checkpoint_dir}",
            "--context_attention", "all_gather", "ring"]


def assert_trains_as_the_whole_sequence(name: str, run: dict) -> None:
    """The all-gathered run's losses are the whole sequence's at every step, and a resume after step 3 repeats
    steps 4 and 5."""
    assert len(set(run["losses"])) == 5, (name, run)  # each step's update changes the next loss
    gathered = run["split"]["all_gather"]
    assert "context" in gathered["attention_gathers_over"], (name, gathered)
    assert_close(gathered["context_losses"], run["losses"], REORDERED, name)
    assert gathered["data_step"] == 3
    assert_close(gathered["resumed_losses"], gathered["context_losses"][3:], REORDERED, name)


def assert_ring_trains_as_the_whole_sequence(name: str, run: dict) -> None:
    ring = run["split"]["ring"]
    assert "context" in ring["permutes_over"] and "context" not in ring["attention_gathers_over"], (name, ring)
    assert_close(ring["context_losses"], run["losses"], REORDERED, f"{name}, ring")


def test_a_collective_group_is_named_by_the_mesh_axes_it_spans():
    mesh = {"data": 2, "fsdp": 1, "context": 4, "tensor": 1}
    assert mesh_axes((4, 5, 6, 7), mesh) == ("context",)
    assert mesh_axes((1, 5), mesh) == ("data",)
    assert mesh_axes(tuple(range(8)), mesh) == ("data", "context")
    assert mesh_axes((0, 9), mesh) == ()  # not this mesh's partitions


def _config(**mesh):
    c = bert_jax.configs.modernbert_base.get_config("tiny")
    c.data.example_builder = "packed"
    c.model.attention_impl = "xla"
    c.mesh.update(mesh)
    return c


@pytest.mark.parametrize("change,words", [
    (dict(context=3), r"config\.mesh\.context=3 does not divide config\.data\.max_seq_length=128"),
    (dict(context=4, attention_impl="triton", splash_interpret=True),
     r"config\.mesh\.context=4 needs the xla attention kernel.*'triton'.*--config\.model\.attention_impl=xla"),
    (dict(context=4, rules="custom", logical_axis_rules=(("length", None),)),
     r"config\.mesh\.context=4 but config\.mesh\.logical_axis_rules maps 'length' to None"),
    (dict(context=4, context_attention="ulysses"),
     r"config\.mesh\.context_attention='ulysses'; expected one of all_gather, ring"),
    (dict(context=4, context_attention="ring", attention_dropout_rate=0.1),
     r"config\.mesh\.context_attention='ring' applies no attention dropout.*attention_dropout_rate=0\.1"),
])
def test_config_refuses_what_the_context_axis_cannot_split(change, words):
    c = _config()
    for key in ("attention_impl", "splash_interpret", "attention_dropout_rate"):
        if key in change:
            c.model[key] = change.pop(key)
    c.mesh.update(change)
    with pytest.raises(ValueError, match=words):
        validate_config(c)
    c.mesh.update(context=1, context_attention="all_gather")
    validate_config(c)  # without the axis, the same config is fine


@pytest.mark.parametrize("change,words", [
    (dict(context_attention="ring"), r"^config\.mesh\.context_attention='ring' passes keys round a ring, which the "
                                     r"splash kernel does not"),
    (dict(max_seq_length=256), r"^config\.model\.attention_impl='splash' at config\.mesh\.context=4 needs each "
                               r"device's 64 tokens .* a multiple of 128"),
    (dict(objective="clm"), r"^config\.model\.attention_impl='splash' at config\.mesh\.context=4 applies no causal "
                            r"mask .*objective='clm'"),
    (dict(local_attention=512), r"^config\.model\.attention_impl='splash' at config\.mesh\.context=4: the local "
                                r"window \(256 tokens either side\) is wider than a device's 128 tokens"),
])
def test_splash_over_the_context_axis_is_refused_where_it_cannot_split(change, words):
    """Splash splits over the axis for bidirectional global layers under all_gather, windows within a shard by the
    halo, at 128 tokens a device or a multiple; anything else is refused in one line naming the alternative."""
    c = _config(context=4)
    c.model.update(attention_impl="splash", splash_interpret=True, max_position_embeddings=512)
    c.data.max_seq_length = 512
    validate_config(c)  # 128 tokens a device, a 8-token window: it splits
    for key, value in change.items():
        (c.mesh if key == "context_attention" else c.data if key == "max_seq_length" else c.model)[key] = value
    if "objective" in change:
        c.data.objective = change["objective"]
    with pytest.raises(ValueError, match=words):
        validate_config(c)
    deberta = bert_jax.configs.deberta_v3_xsmall.get_config("tiny")
    deberta.model.update(attention_impl="splash", splash_interpret=True)
    deberta.mesh.context = 4
    with pytest.raises(ValueError, match=r"^config\.model\.attention_impl='splash' at config\.mesh\.context=4: the "
                                         r"fused kernel that adds disentangled attention's position terms"):
        validate_config(deberta)


def test_a_context_axis_across_slices_is_refused_naming_dcn_shape():
    """config.mesh.dcn_shape lists (data, fsdp, tensor): the context axis stays inside a slice, its collectives on
    ICI. A dcn_shape in the mesh's four axes is refused in one line at validation, not when the mesh is built."""
    c = _config(context=4, dcn_shape=(1, 1, 2, 1))
    with pytest.raises(ValueError, match=r"^config\.mesh\.dcn_shape=\(1, 1, 2, 1\) lists 4 axes, but the context axis "
                                         r"cannot cross slices[^\n]*config\.mesh\.context within one$"):
        validate_config(c)
    c.mesh.dcn_shape = (2, 1, 1)  # data across slices, context inside each
    validate_config(c)


def test_deberta_v3_score_bias_round_the_ring_is_refused_at_validation():
    """Disentangled attention's position terms are a [query, key] score bias: the all-gather splits them exactly
    (the slow test above trains it), the ring passes only keys and values, so config validation refuses it."""
    c = bert_jax.configs.deberta_v3_xsmall.get_config("tiny")
    c.model.attention_impl = "xla"
    c.mesh.update(context=4, context_attention="ring")
    with pytest.raises(ValueError, match=r"^config\.mesh\.context_attention='ring' at config\.mesh\.context=4 cannot "
                                         r"add disentangled attention's position terms \(DeBERTa-v3\).*use "
                                         r"config\.mesh\.context_attention=all_gather[^\n]*$"):
        validate_config(c)
    c.mesh.context_attention = "all_gather"
    validate_config(c)


def test_a_context_attention_scheme_without_the_axis_is_refused():
    c = _config(context_attention="ring")
    with pytest.raises(ValueError, match=r"config\.mesh\.context_attention='ring' does nothing at "
                                         r"config\.mesh\.context=1"):
        validate_config(c)
    c.mesh.context = 4
    validate_config(c)


def test_tiny_config_with_context_validates():
    c = bert_jax.configs.tiny.get_config()
    c.mesh.context = 4
    validate_config(c)


def test_search_tries_the_context_axis_with_its_batch_split():
    from bert_jax.parallel.tpu_slices import parse_slice
    from bert_jax.plan import plan_search
    c = bert_jax.configs.modernbert_base.get_config("tiny")
    c.train.global_batch_size = 16
    v5e16 = parse_slice("v5e-16")
    assert plan_search.context_meshes(c, v5e16) == ("cp2", "ring2", "cp4", "ring4", "cp8", "ring8", "cp16", "ring16")
    assert plan_search.micro_batch(c, v5e16, "cp4", 1) == 4  # 16 sequences over 4 batch shards
    assert plan_search.accumulation_steps(c, v5e16, "cp4") == [1, 2, 4]
    cp4 = plan_search.Candidate(True, "cp4", "full", 1)
    assert cp4.overrides()["mesh.context"] == 4 and "--config.mesh.context=4" in cp4.flags()
    assert plan_search.mesh_name(plan_search.apply(c, cp4, 1)) == "cp4"
    ring4 = plan_search.apply(c, plan_search.Candidate(True, "ring4", "full", 1), 1)
    assert (ring4.mesh.context, ring4.mesh.context_attention, plan_search.mesh_name(ring4)) == (4, "ring", "ring4")
    assert plan_search.apply(ring4, cp4, 1).mesh.context_attention == "all_gather"
    assert plan_search.apply(ring4, plan_search.Candidate(True, "fsdp", "full", 1), 1).mesh.context == 1


def test_the_32k_recipe_scales_the_global_theta_and_splits_its_sequences():
    c = bert_jax.configs.modernbert_base.get_config("context_32k")
    assert (c.data.max_seq_length, c.mesh.context, c.model.attention_impl) == (32_768, 4, "splash")
    assert c.model.global_rope_theta == round(160_000 * 4 ** (64 / 62)) and c.model.local_rope_theta == 10_000
    with building_for("tpu"):  # splash: a TPU kernel
        validate_config(c)
    c.model.attention_impl = "xla"  # the GPU's
    validate_config(c)
    validate_config(bert_jax.configs.modernbert_base.get_config("tiny,context_32k"))


def test_auto_resolves_to_the_kernel_that_splits():
    from bert_jax.train.config_validation import resolve_config
    c = bert_jax.configs.modernbert_base.get_config("tiny")
    c.mesh.context = 4
    assert c.model.attention_impl == "auto"
    assert resolve_config(c).model.attention_impl == "xla"
    c.mesh.context = 1
    assert resolve_config(c).model.attention_impl == "auto"


@pytest.mark.parametrize("window,causal", [(None, False), (3, False), (3, True)])
def test_query_chunks_give_xla_attention_and_its_gradients(window, causal):
    """The split sequence's kernel: each device's queries a chunk at a time against every key (here one device,
    the same arithmetic)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from bert_jax.kernels import attention as kernels
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 32, 2, 8)), jnp.float32) for _ in range(3))
    segments = jnp.asarray(np.repeat([[0, 1, 2, 3], [0, 0, 1, -1]], 8, axis=1), jnp.int32)  # crosses 8-token shards
    whole = lambda q, k, v: kernels.xla_attention(q, k, v, segments, window, causal=causal)  # noqa: E731
    chunked = lambda q, k, v: kernels.xla_attention_by_query_chunks(  # noqa: E731
        q, k, v, segments, window, CONTEXT, causal=causal)
    np.testing.assert_allclose(chunked(q, k, v), whole(q, k, v), rtol=1e-6, atol=1e-6)
    loss = lambda f: lambda *a: jnp.sum(f(*a) ** 2)  # noqa: E731
    for got, want in zip(jax.grad(loss(chunked), (0, 1, 2))(q, k, v), jax.grad(loss(whole), (0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert kernels.query_chunk(8) == 4 and kernels.query_chunk(8192) == 512
    # 32k keys, 4 rows x 12 heads on a device: 512 queries' float32 scores would take 3.2 GB; 128 take 0.8 GB.
    assert kernels.query_chunk(8192, 32768, 4 * 12) == 128 and kernels.query_chunk(8192, 8192, 4 * 12) == 512


def test_the_plans_collectives_table_names_the_context_axis():
    import types

    from bert_jax.plan import links
    from bert_jax.plan.collectives import Collective
    from bert_jax.plan.report_collectives import collective_lines
    mesh = {"data": 1, "fsdp": 4, "context": 4, "tensor": 1}  # v5e-16 as context_32k's
    found = (Collective("all-gather", 1e8, 4, 1, True, 22, "attend/k", group=(0, 1, 2, 3)),  # along context
             Collective("all-gather", 1e7, 4, 1, True, 22, "wqkv", group=(0, 4, 8, 12)))  # along fsdp
    plan = types.SimpleNamespace(collectives=found, links=links.links_of("v5e", is_gpu=False), mesh_shape=mesh)
    rows = [line for line in collective_lines(plan, "chip") if line.startswith("| all-gather")]
    assert [row.split(" | ")[2] for row in rows] == ["context", "fsdp"]
    assert float(rows[0].split(" | ")[6]) > 0  # bytes sent within the slice (ICI), none between
    assert float(rows[0].split(" | ")[7]) == 0
