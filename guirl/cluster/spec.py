"""The cluster file: which hosts run which roles, how each host is reached, and where every socket binds.

```toml
[cluster]
name = "osworld-8b"
keys_dir = "keys"                   # CURVE keys of the cluster (`guirl keys init keys`); "" = none (one host)
port_range = "5500-5599"            # ports the roles' sockets take, per host, unless a role names its own

[hosts.gpu0]
address = "10.0.0.1"                # the interface guirl binds on this host, and the address peers dial
launcher = "ssh"                    # local | ssh | slurm
python = "/opt/guirl/.venv/bin/python"   # the guirl install to run there
workdir = "/srv/guirl"
ssh_user = "guirl"

[hosts.cpu1]
address = "10.0.0.2"
launcher = "ssh"

[roles.coordinator]
host = "gpu0"

[roles.broker]
host = "gpu0"
gpus = [4, 5, 6, 7]                 # its engines' GPUs on that host (the judge's: roles.prm.gpus)

[roles.learner]
hosts = ["gpu0"]                    # its hosts; rank 0 (the learner actor) on the first starts the others
gpus = [0, 1, 2, 3]                 # one rank per GPU on each host (train.ranks = 4 x hosts)

[[roles.env_workers]]
host = "cpu1"
count = 8
vms = 8
```

A bad file is a clear error naming the key (`hosts.cpu1.launcher: expected one of local, ssh, slurm`); roles
that name unknown hosts, two roles on one host and port, a port outside the range, or a socket that would
bind all interfaces without `bind_all = true` are refused. `single_host()` is the cluster every one-machine
`guirl` command runs: one `local` host on loopback, every role on it.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from guirl.errors import InputError

Port = Annotated[int, Meta(ge=1, le=65535)]
Count = Annotated[int, Meta(ge=0)]


class ClusterFileError(InputError):
    """The cluster file cannot be used; the message names the key."""


class ClusterSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str = "guirl"
    """The cluster's name (the run's, and its processes' label on every host)."""
    keys_dir: str = ""
    """CURVE key directory (`guirl keys init`); required as soon as a role is on another host."""
    port_range: str = "5500-5599"
    """Ports the roles' sockets take on each host, lowest first, unless a role names its own."""
    bind_all: bool = False
    """Let sockets bind 0.0.0.0 (a host whose `address` is 0.0.0.0); off, they bind the host's address."""


class Host(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    address: str
    """The interface guirl binds on this host, and the address the other hosts dial."""
    launcher: Literal["local", "ssh", "slurm"] = "local"
    """How processes are started there: subprocesses, the OpenSSH client, or Slurm (srun)."""
    python: str = ""
    """The Python of the guirl install on that host (empty: this process's own)."""
    workdir: str = ""
    """Working directory of the processes there (empty: the launcher's default)."""
    ssh_user: str = ""
    """`ssh` launcher: the user to log in as (empty: ssh's default)."""
    ssh_port: Port = 22
    """`ssh` launcher: the port of the host's SSH server."""
    ssh_options: list[str] = msgspec.field(default_factory=list)
    """`ssh` launcher: extra `-o` options (e.g. `IdentityFile=...`)."""
    slurm_args: list[str] = msgspec.field(default_factory=list)
    """`slurm` launcher: extra `srun` arguments (partition, account, ...)."""
    slurm_node: str = ""
    """`slurm` launcher: the Slurm node name of this host (`srun --nodelist`; empty: any node)."""


class Role(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str
    """The host the role runs on."""
    port: Port | None = None
    """Its mailbox's port (empty: the next free one of the cluster's port range)."""
    gpus: list[Count] = msgspec.field(default_factory=list)
    """Physical GPU ids on the role's host: the broker's rollout engines (`roles.broker.gpus`), the judge's
    engines (`roles.prm.gpus`: on the broker's host, which serves the judge). Empty: the split comes from
    NUM_GPUS / ACTOR_GPUS / ROLLOUT_GPUS / PRM_GPUS on one host's CUDA_VISIBLE_DEVICES."""


class LearnerRole(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    hosts: list[str]
    """Hosts of the learner's ranks; the first runs rank 0 (the learner actor), which starts the others
    (torchrun's variables, rendezvous at `master_port` on the first host)."""
    gpus_per_host: Annotated[int, Meta(ge=1)] | None = None
    """Ranks per host, one per GPU (empty: the config's `train.ranks` on one host, 1 on each of several)."""
    gpus: list[Count] = msgspec.field(default_factory=list)
    """Physical GPU ids of the ranks on each learner host (as many as `gpus_per_host`, which they set when
    it is empty); empty: see `roles.broker.gpus`."""
    port: Port | None = None
    """The learner actor's mailbox port."""
    master_port: Port | None = None
    """torch.distributed's rendezvous port on the first host (empty: from the port range)."""


class EnvWorkers(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str
    """The host of these env workers."""
    count: Annotated[int, Meta(ge=1)] = 1
    """How many env worker processes."""
    vms: Annotated[int, Meta(ge=1)] = 1
    """VMs each worker owns."""


class Roles(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    coordinator: Role
    broker: Role
    learner: LearnerRole | None = None
    prm: Role | None = None
    env_workers: list[EnvWorkers] = msgspec.field(default_factory=list)


class ClusterFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    cluster: ClusterSection = msgspec.field(default_factory=ClusterSection)
    hosts: dict[str, Host]
    roles: Roles

    @property
    def multi_host(self) -> bool:
        return len(self.used_hosts()) > 1

    def used_hosts(self) -> list[str]:
        r = self.roles
        names = [r.coordinator.host, r.broker.host]
        names += r.learner.hosts if r.learner else []
        names += [r.prm.host] if r.prm is not None else []
        names += [w.host for w in r.env_workers]
        return list(dict.fromkeys(names))

    def ports(self) -> dict[tuple[str, str], int]:
        """Every socket's (host, role) -> port: the named ones, then the range's free ones in role order."""
        low, high = parse_port_range(self.cluster.port_range)
        r = self.roles
        wanted: list[tuple[str, str, int | None]] = [
            (r.coordinator.host, "coordinator", r.coordinator.port),
            (r.broker.host, "broker", r.broker.port),
        ]
        if r.learner is not None:
            wanted.append((r.learner.hosts[0], "learner", r.learner.port))
            wanted.append((r.learner.hosts[0], "learner.master", r.learner.master_port))
        if r.prm is not None:
            wanted.append((r.prm.host, "prm", r.prm.port))
        # ports are taken per address: two host entries on one address (one machine, two launchers) share them
        address = {name: h.address for name, h in self.hosts.items()}
        taken: dict[str, set[int]] = {}
        out: dict[tuple[str, str], int] = {}
        for host, name, port in wanted:
            if port is None:
                continue
            used = taken.setdefault(address.get(host, host), set())
            if port in used:
                other = next(
                    k[1] for k, v in out.items() if address.get(k[0], k[0]) == address.get(host) and v == port
                )
                raise ClusterFileError(f"roles.{name}.port: {port} is already {other}'s on host {host!r}")
            used.add(port)
            out[(host, name)] = port
        for host, name, port in wanted:
            if port is not None:
                continue
            used = taken.setdefault(address.get(host, host), set())
            free = next((p for p in range(low, high + 1) if p not in used), None)
            if free is None:
                raise ClusterFileError(
                    f"cluster.port_range {self.cluster.port_range!r} has no port left on {host!r}"
                )
            used.add(free)
            out[(host, name)] = free
        return out


def parse_port_range(text: str) -> tuple[int, int]:
    try:
        low_s, high_s = text.split("-")
        low, high = int(low_s), int(high_s)
    except ValueError:
        raise ClusterFileError(f"cluster.port_range {text!r}: expected LOW-HIGH, e.g. 5500-5599") from None
    if not 1 <= low <= high <= 65535:
        raise ClusterFileError(f"cluster.port_range {text!r}: expected 1 <= LOW <= HIGH <= 65535")
    return low, high


def load_cluster(path: str | Path) -> ClusterFile:
    """Read and check a cluster file; ClusterFileError naming the key otherwise."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ClusterFileError(f"cannot read cluster file {str(path)!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ClusterFileError(f"cluster file {str(path)!r} is not TOML: {exc}") from None
    return parse_cluster(raw, where=str(path))


def parse_cluster(raw: dict, *, where: str = "cluster file") -> ClusterFile:
    hosts = raw.get("hosts")
    if isinstance(hosts, dict):  # one by one, so that an error names the host (msgspec says `hosts[...]`)
        for name, host in hosts.items():
            _convert(host, Host, f"hosts.{name}", where)
    spec = _convert(raw, ClusterFile, "", where)
    check(spec)
    return spec


def _convert(value: object, kind: type, prefix: str, where: str):
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        key = message.rsplit(" - at `$", 1)[-1].rstrip("`").lstrip(".") if " - at `$" in message else ""
        key = ".".join(k for k in (prefix, key) if k)
        what = message.split(" - at ", 1)[0]
        raise ClusterFileError(f"{where}: {key + ': ' if key else ''}{what}") from None


def check(spec: ClusterFile) -> None:
    """Cross-field rules: known hosts, sane addresses, ports, keys for a multi-host cluster."""
    r = spec.roles
    refs = [("roles.coordinator.host", r.coordinator.host), ("roles.broker.host", r.broker.host)]
    if r.learner is not None:
        if not r.learner.hosts:
            raise ClusterFileError("roles.learner.hosts: at least one host")
        refs += [(f"roles.learner.hosts[{i}]", h) for i, h in enumerate(r.learner.hosts)]
    if r.learner is not None and len(set(r.learner.hosts)) != len(r.learner.hosts):
        raise ClusterFileError(
            "roles.learner.hosts: a host is listed twice (gpus_per_host sets ranks per host)"
        )
    if r.prm is not None:
        refs.append(("roles.prm.host", r.prm.host))
    if r.coordinator.gpus:
        raise ClusterFileError("roles.coordinator.gpus: the coordinator uses no GPU")
    named = {"roles.broker.gpus": r.broker.gpus, "roles.prm.gpus": r.prm.gpus if r.prm else []}
    named["roles.learner.gpus"] = r.learner.gpus if r.learner else []
    for key, ids in named.items():
        if len(set(ids)) != len(ids):
            raise ClusterFileError(f"{key}: {ids} lists a GPU twice")
    if (
        r.learner is not None
        and r.learner.gpus
        and r.learner.gpus_per_host not in (None, len(r.learner.gpus))
    ):
        raise ClusterFileError(
            f"roles.learner.gpus: {len(r.learner.gpus)} GPU(s), but gpus_per_host is "
            f"{r.learner.gpus_per_host}"
        )
    shared = set(r.broker.gpus) & set(named["roles.prm.gpus"])
    if shared:
        raise ClusterFileError(
            f"roles.prm.gpus: GPU(s) {sorted(shared)} are the broker's too (both on its host)"
        )
    if r.learner is not None and r.broker.host in r.learner.hosts:
        both = set(r.learner.gpus) & (set(r.broker.gpus) | set(named["roles.prm.gpus"]))
        if both:
            raise ClusterFileError(
                f"roles.learner.gpus: GPU(s) {sorted(both)} of host {r.broker.host!r} are the broker's too"
            )
    refs += [(f"roles.env_workers[{i}].host", w.host) for i, w in enumerate(r.env_workers)]
    for key, host in refs:
        if host not in spec.hosts:
            known = ", ".join(sorted(spec.hosts)) or "none"
            raise ClusterFileError(f"{key}: no host {host!r} in [hosts] (known: {known})")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", spec.cluster.name):
        raise ClusterFileError(
            f"cluster.name {spec.cluster.name!r}: letters, digits, '-' and '_' only (at most 64); it labels "
            "the cluster's processes on every host and names its control socket"
        )
    for name, host in spec.hosts.items():
        try:
            address = ipaddress.ip_address(host.address)
        except ValueError:
            raise ClusterFileError(f"hosts.{name}.address: {host.address!r} is not an IP address") from None
        if address.version != 4:
            raise ClusterFileError(
                f"hosts.{name}.address: {host.address} is IPv6; give the host's IPv4 address"
            )
        for key in ("ssh_user", "slurm_node", "python", "workdir"):
            if getattr(host, key).startswith("-"):
                raise ClusterFileError(f"hosts.{name}.{key}: {getattr(host, key)!r} may not start with '-'")
        if address.is_unspecified and not spec.cluster.bind_all:
            raise ClusterFileError(
                f"hosts.{name}.address: {host.address} would bind every interface; give the host's address, "
                "or set cluster.bind_all = true"
            )
    parse_port_range(spec.cluster.port_range)
    spec.ports()  # duplicate ports, an exhausted range
    if spec.multi_host and not spec.cluster.keys_dir:
        raise ClusterFileError(
            "cluster.keys_dir: roles run on several hosts, so their sockets need the cluster's CURVE keys "
            "(guirl keys init DIR)"
        )


def single_host(name: str = "guirl", *, workers: int = 1, vms: int = 1, learner: bool = False) -> ClusterFile:
    """The cluster of a one-machine command: one `local` host on loopback, every role on it, no keys."""
    roles = Roles(
        coordinator=Role(host="local"),
        broker=Role(host="local"),
        learner=LearnerRole(hosts=["local"]) if learner else None,
        env_workers=[EnvWorkers(host="local", count=workers, vms=vms)],
    )
    spec = ClusterFile(
        cluster=ClusterSection(name=name),
        hosts={"local": Host(address="127.0.0.1", launcher="local")},
        roles=roles,
    )
    check(spec)
    return spec


class FollowerHost(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Where a learner rank runs when the learner spans hosts: started through `host`'s launcher."""

    host: str
    """The cluster host's name."""
    spec: Host
    """How to reach it (its launcher, address, Python)."""
    cluster: str
    """The cluster's name (the rank's label, for `bin/launch_cluster --down`)."""
    local_rank: int = 0
    """Its rank among the learner ranks of that host."""
