"""ddlkit.compute.gang: the schema base of a gang target, and what ComputeTarget reads of it."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ddlkit import ComputeTarget, ConfigError, JobHandle, JobSpec
from ddlkit.compute.gang import ElasticGangConfig, GangConfig, is_gang, world_size
from ddlkit.config import named_schema
from ddlkit.options import POSITIVE_INTEGER, checked
from ddlkit.plugins import installed_registry


@dataclass
class ClusterConfig(ElasticGangConfig):
    # a target's own default, declared again
    procs_per_node: int = checked(4, POSITIVE_INTEGER)
    partition: str = "gpu"


@dataclass
class FixedConfig(GangConfig):
    pass


class Target(ComputeTarget):
    def submit(self, spec: JobSpec) -> JobHandle:
        raise NotImplementedError


def typed(schema: type, **values: object) -> typing.Any:
    """The node a target is built from: its schema (with ``name``, as the config composes it) and values."""
    return OmegaConf.merge(OmegaConf.structured(named_schema(schema, "cluster")), values)


def test_world_size_is_nodes_times_procs_per_node_on_the_schema_and_its_typed_node():
    assert ClusterConfig(nodes=3).world_size == 12
    assert world_size(typed(ClusterConfig, nodes=3, procs_per_node=2)) == 6
    assert Target(typed(ClusterConfig, nodes=3, procs_per_node=2)).world_size == 6
    assert Target(ClusterConfig(nodes=2)).world_size == 8
    # a target whose schema is no gang: one rank unless it says otherwise
    assert Target(OmegaConf.create({"nodes": 3, "procs_per_node": 2})).world_size == 1


def test_is_gang_sees_the_schema_through_the_typed_node():
    assert is_gang(typed(ClusterConfig)) and is_gang(typed(ClusterConfig), elastic=True)
    assert is_gang(FixedConfig()) and not is_gang(typed(FixedConfig), elastic=True)
    assert not is_gang(OmegaConf.create({"nodes": 2})) and not is_gang({"nodes": 2})


def test_the_fields_rules_are_checked_when_the_target_is_built():
    with pytest.raises(ConfigError, match=r"^compute\.nodes=0 is invalid: it must be a positive integer\.$"):
        Target(typed(ClusterConfig, nodes=0))
    with pytest.raises(ConfigError, match=r"^compute\.min_nodes=0 is invalid"):
        Target(ClusterConfig(min_nodes=0))


def test_nodes_and_min_nodes_come_from_the_typed_fields():
    target = Target(typed(ClusterConfig, nodes=4, min_nodes=2))
    assert (target.nodes, target.min_nodes) == (4, 2)
    assert (Target(typed(ClusterConfig, nodes=4)).min_nodes) == 4  # null: not elastic
    # a gang that is not elastic has no min_nodes: all of its nodes
    assert (Target(typed(FixedConfig, nodes=3)).nodes, Target(typed(FixedConfig, nodes=3)).min_nodes) == (3, 3)
    with pytest.raises(ConfigError, match=r"compute\.min_nodes=5 must be between 1 and compute\.nodes=4"):
        _ = Target(typed(ClusterConfig, nodes=4, min_nodes=5)).min_nodes


def test_a_config_that_is_no_gang_is_still_read_by_name():
    target = Target(OmegaConf.create({"nodes": 4, "min_nodes": 2}))
    assert (target.nodes, target.min_nodes) == (4, 2)
    assert (Target(OmegaConf.create({})).nodes, Target(OmegaConf.create({})).min_nodes) == (1, 1)


@pytest.mark.parametrize("as_node", [True, False], ids=["typed node", "dataclass"])
def test_with_nodes_keeps_the_gang(as_node: bool):
    cfg = typed(ClusterConfig, nodes=4, min_nodes=2) if as_node else ClusterConfig(nodes=4, min_nodes=2)
    smaller = Target(cfg).with_nodes(3, JobSpec(name="j", job_dir=Path(".")))
    assert (smaller.nodes, smaller.min_nodes, smaller.world_size) == (3, 2, 12)
    assert is_gang(smaller.cfg, elastic=True)


def _declares_int(schema: type, name: str) -> bool:
    hints = typing.get_type_hints(schema)
    return any(f.name == name for f in dataclasses.fields(schema)) and hints.get(name) is int


def test_every_installed_target_with_nodes_of_procs_per_node_ranks_is_a_gang():
    registry = installed_registry()
    gangs = []
    for name in registry.names("compute"):
        schema = registry.get("compute", name).config
        if schema is None or not (_declares_int(schema, "nodes") and _declares_int(schema, "procs_per_node")):
            continue
        assert issubclass(schema, GangConfig), f"compute={name}'s schema {schema.__name__} is no GangConfig"
        if any(f.name == "min_nodes" for f in dataclasses.fields(schema)):
            assert issubclass(schema, ElasticGangConfig), f"compute={name} has min_nodes: an ElasticGangConfig"
        gangs.append(name)
    assert gangs, "no installed gang target: the test would prove nothing"
