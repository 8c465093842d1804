"""Test hosts for the cluster launcher: network namespaces on a bridge, each with its own address and SSH
server, and a single-node Slurm (slurmctld + slurmd + munged) started for the test.

Everything runs for real: `ip netns`/veth/bridge from iproute2, OpenSSH's sshd with a key made for the test,
Debian's slurm-wlm with munge. They need root (CI runs as root); `scripts/system-packages.txt` installs them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def wait_port(host: str, port: int, timeout: float = 20.0, netns: str = "") -> None:
    """Until `host:port` accepts a connection (a server's readiness; polled with backoff)."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        if netns:
            probe = f"exec 3<>/dev/tcp/{host}/{port}"
            ok = _sh("ip", "netns", "exec", netns, "bash", "-c", probe, check=False)
            if ok.returncode == 0:
                return
        else:
            with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{host}:{port} did not accept connections within {timeout} s")
        time.sleep(delay)  # a readiness poll's backoff, not synchronisation
        delay = min(delay * 2, 0.5)


def can_make_hosts() -> str:
    """Why namespaced hosts cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/usr/sbin/sshd").exists():
        return "sshd is not installed (openssh-server)"
    probe = f"gprobe{os.getpid()}"
    made = _sh("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"network namespaces cannot be made here: {made.stderr.strip()}"
    _sh("ip", "netns", "del", probe, check=False)
    return ""


class _Started:
    """Started by `with`: `_up()` on entry (undone by `close()` if it fails half-way), `close()` on exit."""

    def __enter__(self):
        try:
            self._up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _up(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class NetnsHosts(_Started):
    """`n` hosts `<prefix>h1..hn` with addresses 10.<net>.0.11.. on a bridge, each running sshd."""

    def __init__(self, n: int, workdir: Path) -> None:
        tag = uuid.uuid4().hex[:5]
        self.prefix = f"g{tag}"
        self.bridge = f"gb{tag}"
        self.net = 100 + int(tag, 16) % 150
        self.workdir = workdir
        self.names = [f"{self.prefix}h{i + 1}" for i in range(n)]
        self.addresses = {name: f"10.{self.net}.0.{11 + i}" for i, name in enumerate(self.names)}
        self.sshd: dict[str, subprocess.Popen] = {}
        self.key = workdir / "id_ed25519"

    def _up(self) -> None:
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"10.{self.net}.0.1/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            veth, peer = f"{self.prefix}v{i}", f"{self.prefix}p{i}"
            _sh("ip", "netns", "add", name)
            _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            _sh("ip", "link", "set", peer, "netns", name)
            _sh("ip", "link", "set", veth, "master", self.bridge)
            _sh("ip", "link", "set", veth, "up")
            ns = ("ip", "netns", "exec", name)
            _sh(*ns, "ip", "addr", "add", f"{self.addresses[name]}/24", "dev", peer)
            _sh(*ns, "ip", "link", "set", peer, "up")
            _sh(*ns, "ip", "link", "set", "lo", "up")
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        authorized = self.workdir / "authorized_keys"
        authorized.write_text(Path(f"{self.key}.pub").read_text())
        Path("/run/sshd").mkdir(exist_ok=True)
        for name in self.names:
            self._sshd(name, authorized)
        for name in self.names:
            wait_port(self.addresses[name], 22, netns=self.names[0])

    def _sshd(self, name: str, authorized: Path) -> None:
        host_key = self.workdir / f"{name}_host_key"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
        config = self.workdir / f"{name}_sshd_config"
        config.write_text(
            "\n".join(
                [
                    "Port 22",
                    f"ListenAddress {self.addresses[name]}",
                    f"HostKey {host_key}",
                    f"AuthorizedKeysFile {authorized}",
                    f"PidFile {self.workdir / (name + '_sshd.pid')}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "StrictModes no",
                    "UsePAM no",
                    "MaxSessions 200",
                    "MaxStartups 200:30:400",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        log = open(self.workdir / f"{name}_sshd.log", "wb")  # noqa: SIM115 (kept open while sshd runs)
        self.sshd[name] = subprocess.Popen(
            ["ip", "netns", "exec", name, "/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def ssh_options(self) -> list[str]:
        return [
            f"IdentityFile={self.key}",
            "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null",
            "LogLevel=ERROR",
            "ConnectTimeout=10",
        ]

    def exec(self, name: str, *argv: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", name, *argv], capture_output=True, text=True, **kwargs)

    def listening(self, name: str) -> list[tuple[str, int, str]]:
        """(address, port, process) of every listening TCP socket in host `name`."""
        out = self.exec(name, "ss", "-Hltnp").stdout
        rows = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 4:
                continue
            address, _, port = parts[3].rpartition(":")
            rows.append((address.strip("[]"), int(port), parts[5] if len(parts) > 5 else ""))
        return rows

    def close(self) -> None:
        for proc in self.sshd.values():
            proc.terminate()
        for proc in self.sshd.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for name in self.names:
            _sh("ip", "netns", "del", name, check=False)
        _sh("ip", "link", "del", self.bridge, check=False)


def can_run_slurm() -> str:
    """Why a single-node Slurm cannot be started here ("" when it can)."""
    if os.geteuid() != 0:
        return "slurmd needs root"
    for tool in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged"):
        if not Path(tool).exists():
            return f"{tool} is not installed (slurm-wlm, munge)"
    return ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SlurmNode(_Started):
    """munged + slurmctld + slurmd for one node named `localhost`, all state under `workdir`; `env` is
    what Slurm's client commands need (SLURM_CONF)."""

    NODE = "localhost"

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.procs: list[subprocess.Popen] = []
        self.conf = workdir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _up(self) -> None:
        d = self.dir
        for sub in ("munge", "state", "spool"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(d / "munge", 0o700)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        socket_path = d / "munge" / "munge.socket"
        _sh(
            "/usr/sbin/munged",
            "--force",
            f"--key-file={key}",
            f"--socket={socket_path}",
            f"--pid-file={d / 'munge' / 'munged.pid'}",
            f"--seed-file={d / 'munge' / 'seed'}",
            f"--log-file={d / 'munge' / 'munged.log'}",
        )  # daemonises once its socket is up
        ctld, slurmd = _free_port(), _free_port()
        cpus = os.cpu_count() or 2
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=guirltest",
                    "SlurmctldHost=localhost",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"SlurmctldPort={ctld}",
                    f"SlurmdPort={slurmd}",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={socket_path}",
                    f"StateSaveLocation={d / 'state'}",
                    f"SlurmdSpoolDir={d / 'spool'}",
                    f"SlurmctldPidFile={d / 'slurmctld.pid'}",
                    f"SlurmdPidFile={d / 'slurmd.pid'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "DefMemPerNode=100",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    "KillWait=5",
                    f"SlurmctldLogFile={d / 'slurmctld.log'}",
                    f"SlurmdLogFile={d / 'slurmd.log'}",
                    f"NodeName={self.NODE} CPUs={cpus} RealMemory=16000 State=UNKNOWN",
                    f"PartitionName=debug Nodes={self.NODE} Default=YES MaxTime=INFINITE State=UP "
                    "OverSubscribe=FORCE:32",
                    "",
                ]
            )
        )
        for argv in (
            ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)],
            ["/usr/sbin/slurmd", "-D", "-N", self.NODE, "-f", str(self.conf)],
        ):
            log = open(d / (Path(argv[0]).name + ".out"), "wb")  # noqa: SIM115 (kept open while it runs)
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env))
        deadline = time.monotonic() + 60
        delay = 0.05
        while True:  # the node registered and idle: Slurm's own readiness, polled
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=self.env)
            if out.stdout.strip() == "idle":
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm did not come up: {out.stdout} {out.stderr}")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def allocate(self) -> str:
        """A job allocation of the node with no shell (as `salloc` gives a user); its job id."""
        out = subprocess.run(
            ["salloc", "-N1", "--no-shell", "--job-name=alloc"], capture_output=True, text=True, env=self.env
        )
        words = (out.stdout + out.stderr).split("Granted job allocation ", 1)
        if len(words) < 2:
            raise RuntimeError(f"salloc gave no allocation: {out.stderr}")
        return words[1].split()[0]

    def steps(self, job: str, name: str) -> list[str]:
        """Steps of `job` named `name`."""
        argv = ["squeue", "-h", "-s", "-j", job, "-o", "%i %j"]
        rows = subprocess.run(argv, capture_output=True, text=True, env=self.env).stdout.splitlines()
        return [r.split()[0] for r in rows if r.split()[1:] == [name]]

    def jobs(self, name: str = "") -> list[str]:
        argv = ["squeue", "-h", "-o", "%i %j %T"] + ([f"--name={name}"] if name else [])
        return subprocess.run(argv, capture_output=True, text=True, env=self.env).stdout.split("\n")[:-1]

    def close(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, env=self.env)
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(15)
        pid_file = self.dir / "munge" / "munged.pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().strip()), 15)
