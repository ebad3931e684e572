"""Mesh and multi-host settings from the config: shapes, rule presets, and errors that name the key."""
import jax
import pytest
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

import bert_jax.configs.base
from bert_jax.train.config_validation import validate_mesh_fit
from bert_jax.parallel import distributed
from bert_jax.parallel.mesh import (MESH_AXES, RULE_PRESETS, check_divisible, logical_axis_rules,
                                    resolve_mesh_shape, resolve_mesh_shapes)


def test_minus_one_fills_the_devices_left_over():
    assert resolve_mesh_shape((-1, 1, 1), 8) == (8, 1, 1)
    assert resolve_mesh_shape((1, -1, 2), 16) == (1, 8, 2)


@pytest.mark.parametrize("shape,devices,words", [
    ((2, 2, 1), 8, "needs 4 devices, but 8"),
    ((-1, -1, 1), 8, "more than one -1"),
    ((3, -1, 1), 8, "do not divide by 3"),
    ((8, 1), 8, "must have 3 entries"),
])
def test_bad_mesh_shape_names_the_key(shape, devices, words):
    with pytest.raises(ValueError, match=r"config\.mesh\.shape") as error:
        resolve_mesh_shape(shape, devices)
    assert words in str(error.value)


def test_dcn_shape_divides_devices_into_slices():
    cfg = bert_jax.configs.base.get_config().mesh
    cfg.shape, cfg.dcn_shape = (1, -1, 1), (2, 1, 1)
    assert resolve_mesh_shapes(cfg, 16) == ((1, 8, 1, 1), (2, 1, 1, 1))
    cfg.dcn_shape = (3, 1, 1)
    with pytest.raises(ValueError, match=r"config\.mesh\.dcn_shape"):
        resolve_mesh_shapes(cfg, 16)


def test_context_axis_takes_its_devices_before_the_minus_one():
    cfg = bert_jax.configs.base.get_config().mesh
    cfg.context = 4
    assert resolve_mesh_shapes(cfg, 8) == ((2, 1, 4, 1), (1, 1, 1, 1))
    cfg.shape = (1, -1, 2)
    assert resolve_mesh_shapes(cfg, 16) == ((1, 2, 4, 2), (1, 1, 1, 1))
    cfg.context = 3
    with pytest.raises(ValueError, match=r"config\.mesh\.context=3 does not divide the 16 devices"):
        resolve_mesh_shapes(cfg, 16)
    cfg.context = 0
    with pytest.raises(ValueError, match=r"config\.mesh\.context=0 must be a positive integer"):
        resolve_mesh_shapes(cfg, 16)


def test_default_preset_keeps_the_custom_rules():
    cfg = bert_jax.configs.base.get_config().mesh
    assert cfg.rules == "fsdp_tp"
    custom = logical_axis_rules(dict(cfg, rules="custom"))
    assert logical_axis_rules(cfg) == custom == RULE_PRESETS["fsdp_tp"]


def test_presets_split_parameters_by_their_strategy():
    rules = {name: dict(RULE_PRESETS[name]) for name in RULE_PRESETS}
    assert all(r["batch"] == ("data", "fsdp") for r in rules.values())
    assert [rules[n]["embed"] for n in ("dp", "fsdp", "tp", "fsdp_tp")] == [None, "fsdp", None, "fsdp"]
    assert [rules[n]["heads"] for n in ("dp", "fsdp", "tp", "fsdp_tp")] == [None, None, "tensor", "tensor"]
    assert all(r["length"] == "context" for r in rules.values())  # a no-op at config.mesh.context=1


def test_unknown_preset_or_mesh_axis_is_named():
    cfg = bert_jax.configs.base.get_config().mesh
    with pytest.raises(ValueError, match=r"config\.mesh\.rules='zero3'"):
        logical_axis_rules(dict(cfg, rules="zero3"))
    with pytest.raises(ValueError, match="'model', which is no mesh axis"):
        logical_axis_rules(dict(cfg, rules="custom", logical_axis_rules=(("heads", "model"),)))


def test_heads_not_dividing_the_tensor_axis_suggests_a_shape():
    config = bert_jax.configs.base.get_config()  # 12 heads
    config.train.global_batch_size = 64
    with pytest.raises(ValueError, match=r"num_heads=12 .* try --config\.mesh\.shape=\(1,-1,4\)"):
        validate_mesh_fit(config, AbstractMesh((1, 1, 1, 8), MESH_AXES))
    validate_mesh_fit(config, AbstractMesh((1, 2, 1, 4), MESH_AXES))


def test_uneven_parameter_split_names_the_parameter():
    mesh = jax.make_mesh((1, 1, 1, 1), MESH_AXES)
    abstract = {"word": {"embedding": jax.ShapeDtypeStruct((30522, 8), "float32")}}
    sharding = NamedSharding(AbstractMesh((1, 1, 1, 4), MESH_AXES), PartitionSpec("tensor", None))
    with pytest.raises(ValueError, match=r"word/embedding has 30522 entries on axis 0.*pad vocab"):
        check_divisible(abstract, {"word": {"embedding": sharding}}, "pad vocab")
    check_divisible(abstract, {"word": {"embedding": NamedSharding(mesh, PartitionSpec("tensor"))}}, "")


def dist_cfg(**kw):
    cfg = bert_jax.configs.base.get_config().distributed
    cfg.update(kw)
    return cfg


def test_single_process_needs_no_initialisation():
    assert distributed.initialize_kwargs(dist_cfg(), environ={}) is None


def test_explicit_coordinator_passes_ids_and_timeouts():
    kwargs = distributed.initialize_kwargs(
        dist_cfg(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=1, heartbeat_timeout_s=7), {})
    assert kwargs["coordinator_address"] == "127.0.0.1:1234"
    # JAX's own heartbeat is the backstop of distributed.PeerWatch (which reports a lost process at 7 s): twice it.
    assert (kwargs["num_processes"], kwargs["process_id"], kwargs["heartbeat_timeout_seconds"]) == (2, 1, 14)


def test_bad_process_id_or_missing_coordinator_is_named():
    with pytest.raises(ValueError, match=r"config\.distributed\.process_id=2"):
        distributed.initialize_kwargs(dist_cfg(coordinator_address="h:1", num_processes=2, process_id=2), {})
    with pytest.raises(ValueError, match=r"config\.distributed\.coordinator_address"):
        distributed.initialize_kwargs(dist_cfg(num_processes=4), {})


@pytest.mark.parametrize("environ,cluster", [
    ({"TPU_WORKER_HOSTNAMES": "t-w-0,t-w-1,t-w-2,t-w-3"}, "tpu"),
    ({"TPU_WORKER_HOSTNAMES": "localhost"}, None),  # a single-host TPU VM: one process
    ({"SLURM_NTASKS": "16", "SLURM_PROCID": "3"}, "slurm"),
    ({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, None),
])
def test_cluster_is_detected_from_the_environment(environ, cluster):
    assert distributed.detected_cluster(environ) == cluster
    kwargs = distributed.initialize_kwargs(dist_cfg(), environ)
    assert (kwargs is not None) == (cluster is not None)
    if kwargs is not None:  # JAX reads coordinator and ids from the environment itself
        assert "coordinator_address" not in kwargs and kwargs["heartbeat_timeout_seconds"] == 200
