"""The placement plan: every proc of every role gets its host and its own GPUs before anything starts;
a plan that cannot fit is a ConfigError naming the counts."""

import pytest

from forge_nb.config import Config, ConfigError
from forge_nb.launch.placement import Host, hosts_for, plan


def _plan(gpus: int, tensor_parallel_size: int = 1, **fields):
    config = Config().updated(fields)
    # Set past validation: the plan places multi-GPU replicas, which a refresh cannot feed yet (test_config).
    config.engine.tensor_parallel_size = tensor_parallel_size
    return plan(config, [Host("node0", gpus)])


def _devices(placement, role):
    return [s.devices for s in placement.of(role)]


def test_each_trainer_proc_gets_a_gpu_and_each_replica_its_tensor_parallel_gpus_after_them():
    p = _plan(8, trainer_procs=4, generator_procs=2, tensor_parallel_size=2)
    assert _devices(p, "trainer") == [(0,), (1,), (2,), (3,)]
    assert _devices(p, "generator") == [(4, 5), (6, 7)]
    assert _devices(p, "reward") == [()] and not p.shared
    assert p.env("trainer", 2) == {"CUDA_VISIBLE_DEVICES": "2", "LOCAL_RANK": "2"}
    assert p.env("generator", 1) == {"CUDA_VISIBLE_DEVICES": "6,7"}
    assert p.env("reward", 0) == {"CUDA_VISIBLE_DEVICES": ""}  # a CPU proc on a GPU host sees none


def test_the_reference_is_sharded_like_the_trainer_on_the_trainers_gpus():
    p = _plan(4, trainer_procs=2, kl_coef=0.1)
    assert _devices(p, "reference") == _devices(p, "trainer") == [(0,), (1,)]
    assert p.env("reference", 1)["LOCAL_RANK"] == "1"
    lora = _plan(4, trainer_procs=2, kl_coef=0.1, lora={"r": 4})
    assert lora.of("reference")[0].role == "reference" and not [s for s in lora.slots if s.role == "reference"]


def test_too_few_gpus_is_a_config_error_naming_the_counts_unless_sharing():
    with pytest.raises(
        ConfigError, match=r"needs 5 GPUs \(trainer 4 x 1, generator 1 x engine.tensor_parallel_size 1\).* has 4"
    ):
        _plan(4, trainer_procs=4, share_gpus="no")
    shared = _plan(4, trainer_procs=4)  # "auto": the generator goes on the trainer's GPUs
    assert shared.shared and _devices(shared, "generator") == [(0,)]
    with pytest.raises(ConfigError, match="needs 8 GPUs and the host has 4"):
        _plan(4, trainer_procs=8)


def test_one_gpu_runs_trainer_and_generator_together_as_before():
    p = _plan(1)
    assert _devices(p, "trainer") == _devices(p, "generator") == [(0,)] and p.shared


def test_without_gpus_or_on_the_cpu_no_proc_gets_one():
    assert all(s.devices == () for s in _plan(0, trainer_procs=2).slots)
    assert _plan(0).env("trainer", 0) == {"LOCAL_RANK": "0"}
    cpu = _plan(8, trainer_procs=2, device="cpu")
    assert all(s.devices == () for s in cpu.slots) and cpu.device("trainer", "cpu") == "cpu"
    assert _plan(8).device("trainer", "auto") == "auto" and _plan(8).device("judge", "auto") == "cpu"


def test_hosts_mesh_puts_the_trainer_first_generators_on_the_others_and_rewards_last():
    config = Config().updated(
        {
            "mesh.kind": "hosts",
            "mesh.hosts": ["tcp://a:1", "tcp://b:1", "tcp://c:1"],
            "generator_procs": 4,
            "gpus_per_host": 2,
            "trainer_procs": 2,
        }
    )
    p = plan(config, hosts_for(config))
    assert [s.host for s in p.of("trainer")] == [0, 0] and _devices(p, "trainer") == [(0,), (1,)]
    assert [s.host for s in p.of("generator")] == [1, 1, 2, 2]  # host-major, as the mesh spawns them
    assert _devices(p, "generator") == [(0,), (1,), (0,), (1,)]
    assert p.host_indices("reward") == [2] and p.host_indices("judge-2", 1) == [2]
    assert [r["host"] for r in p.rows() if r["role"] == "generator"] == ["tcp://b:1"] * 2 + ["tcp://c:1"] * 2


def test_pretended_gpus_come_from_mesh_gpus_per_host():
    config = Config().updated({"gpus_per_host": 3, "trainer_procs": 2})
    assert hosts_for(config) == [Host("localhost", 3)]
    assert _devices(plan(config, hosts_for(config)), "generator") == [(2,)]


def test_what_cannot_be_placed_is_refused_before_anything_starts():
    with pytest.raises(ConfigError, match="tensor_parallel_size=2 splits a replica over vLLM's ranks; the torch"):
        Config().updated({"tensor_parallel_size": 2, "engine.name": "torch"})
    with pytest.raises(ConfigError, match="model.device='cuda' but torch here has no CUDA device"):
        Config().updated({"device": "cuda"})
    with pytest.raises(ConfigError, match="trainer.cpu_offload keeps the trainer's state in host memory"):
        Config().updated({"cpu_offload": True})
    with pytest.raises(ConfigError, match="model.dtype must be 'float32'"):
        Config().updated({"mixed_precision": "bf16", "model.dtype": "bfloat16"})
    assert Config().updated({"mesh.kind": "slurm", "gpus_per_node": 8, "device": "cuda"}).model.device == "cuda"


def _slurm(**fields):
    config = Config().updated({"mesh.kind": "slurm", **fields})
    return plan(config, hosts_for(config))


def _hosts(placement, role):
    return [s.host for s in placement.of(role)]


def test_slurm_nodes_are_shared_out_by_count_trainer_first_then_generators_then_rewards():
    p = _slurm(nodes=3, trainer_procs=2, trainer_hosts=2, gpus_per_node=4)
    assert _hosts(p, "trainer") == [0, 1] and _devices(p, "trainer") == [(0,), (0,)]
    assert _hosts(p, "generator") == [2] and p.host_indices("reward") == [2]  # beside the generator: no node left
    assert [h.name for h in p.hosts] == ["node0", "node1", "node2"]
    big = _slurm(nodes=8, trainer_procs=16, trainer_hosts=4, generator_procs=6, gpus_per_node=4)
    assert _hosts(big, "trainer") == [h for h in range(4) for _ in range(4)]
    assert _hosts(big, "generator") == [4, 4, 5, 5, 6, 6] and big.host_indices("reward") == [7]
    assert _devices(big, "trainer")[:4] == [(0,), (1,), (2,), (3,)] and _devices(big, "generator")[:2] == [(0,), (1,)]
    assert _hosts(_slurm(separate_hosts=True), "generator") == [1]  # older configs: trainer, generator, reward


def test_a_slurm_shape_that_cannot_be_placed_or_leaves_a_node_idle_is_a_config_error():
    with pytest.raises(ConfigError, match=r"trainer_procs=3 cannot be spread evenly over mesh.trainer_hosts=2"):
        _slurm(nodes=3, trainer_procs=3, trainer_hosts=2)
    with pytest.raises(ConfigError, match=r"trainer_hosts=3 leaves no host for the generator: the mesh has 3"):
        _slurm(nodes=3, trainer_procs=3, trainer_hosts=3)
    with pytest.raises(ConfigError, match=r"slurm.nodes=5 but the shape uses 3: trainer 1 node\(s\)"):
        _slurm(nodes=5)
    with pytest.raises(ConfigError, match=r"generator_hosts=2: 1 host\(s\) are left"):
        _slurm(nodes=2, generator_hosts=2)
    with pytest.raises(ConfigError, match=r"the mesh has 1 host \(slurm.nodes\)"):
        _slurm(trainer_hosts=2)
    with pytest.raises(ConfigError, match="slurm.separate_hosts puts the generator, trainer and reward on a node each"):
        Config().updated({"slurm.separate_hosts": True, "slurm.nodes": 4})
