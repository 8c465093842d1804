"""The cluster file: the shipped example parses; every bad file is a clear error naming its key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from guirl.cluster.spec import ClusterFileError, load_cluster, parse_cluster, single_host

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "clusters" / "two_hosts.toml"


def example() -> dict:
    return tomllib.loads(EXAMPLE.read_text())


def test_the_example_parses_and_ports_come_from_the_range() -> None:
    spec = load_cluster(EXAMPLE)
    assert spec.multi_host and spec.used_hosts() == ["gpu0", "cpu1"]
    ports = spec.ports()
    assert ports[("gpu0", "coordinator")] == 5500 and ports[("gpu0", "broker")] == 5501
    assert ports[("gpu0", "learner")] == 5502 and ports[("gpu0", "learner.master")] == 5503
    assert spec.roles.env_workers[0].count == 8 and spec.hosts["cpu1"].launcher == "ssh"


def test_a_named_port_is_kept_and_skipped_by_the_range() -> None:
    raw = example()
    raw["roles"]["broker"]["port"] = 5500
    ports = parse_cluster(raw).ports()
    assert ports[("gpu0", "broker")] == 5500 and ports[("gpu0", "coordinator")] == 5501


def test_single_host_is_a_valid_one_host_cluster() -> None:
    spec = single_host("run", workers=2, vms=3, learner=True)
    assert not spec.multi_host and spec.hosts["local"].address == "127.0.0.1"
    assert spec.roles.env_workers[0].count == 2 and spec.roles.learner is not None


def edit(path: str, value: object) -> dict:
    raw = example()
    node = raw
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[k]
    if value is None:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return raw


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        ("hosts.cpu1.launcher", "telnet", "hosts.cpu1.launcher"),
        ("hosts.cpu1.adress", "10.0.0.3", "adress"),
        ("hosts.cpu1.address", "not-an-ip", "hosts.cpu1.address"),
        ("hosts.cpu1.address", "0.0.0.0", "would bind every interface"),
        ("roles.broker.host", "gpu9", "roles.broker.host: no host 'gpu9'"),
        ("roles.learner.hosts", [], "roles.learner.hosts"),
        ("roles.broker.port", 70000, "roles.broker.port"),
        ("roles.coordinator", None, "coordinator"),
        ("cluster.keys_dir", "", "cluster.keys_dir"),
        ("cluster.port_range", "5600", "cluster.port_range"),
        ("cluster.port_range", "5600-5500", "cluster.port_range"),
        ("cluster.port_range", "5500-5502", "no port left"),
        ("roles.learner.gpus_per_host", 0, "roles.learner.gpus_per_host"),
    ],
)
def test_bad_files_name_the_key(path: str, value: object, says: str) -> None:
    with pytest.raises(ClusterFileError, match=None) as err:
        parse_cluster(edit(path, value))
    assert says in str(err.value)


def test_two_roles_on_one_port_are_refused() -> None:
    raw = example()
    raw["roles"]["broker"]["port"] = 5510
    raw["roles"]["coordinator"]["port"] = 5510
    with pytest.raises(ClusterFileError, match="5510 is already coordinator's on host 'gpu0'"):
        parse_cluster(raw)


def test_bind_all_must_be_asked_for() -> None:
    raw = edit("hosts.cpu1.address", "0.0.0.0")
    raw["cluster"]["bind_all"] = True
    assert parse_cluster(raw).hosts["cpu1"].address == "0.0.0.0"


def test_unreadable_and_non_toml_files(tmp_path: Path) -> None:
    with pytest.raises(ClusterFileError, match="cannot read"):
        load_cluster(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[hosts\n")
    with pytest.raises(ClusterFileError, match="not TOML"):
        load_cluster(bad)
