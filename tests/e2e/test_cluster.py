"""`bin/launch_cluster` across hosts: three network namespaces on a bridge, each with its own address and
SSH server; the head host runs the launcher (coordinator, broker and learner as local children), env
workers with local desktops run on the two others through the `ssh` launcher; every socket between them
is CURVE-encrypted. And a single-node Slurm running the same small cluster through the `slurm` launcher.

Synchronisation is on what the launcher prints and on its control socket's answers, never on sleeps."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cluster_hosts import NetnsHosts, SlurmNode, can_make_hosts, can_run_slurm

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = [sys.executable, str(ROOT / "bin" / "launch_cluster")]
WHY_NOT = can_make_hosts()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with NetnsHosts(3, tmp_path_factory.mktemp("hosts")) as made:
        yield made


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    from guirl.runtime.security import init_keys

    return init_keys(tmp_path_factory.mktemp("keys") / "keys").path


def ssh_cluster(
    hosts: NetnsHosts, keys: Path, name: str, *, per_host: int = 1, learner: tuple[str, ...] = ("head",)
) -> str:
    head, env1, env2 = hosts.names
    opts = ", ".join(json.dumps(o) for o in hosts.ssh_options())
    remote = f'launcher = "ssh"\nssh_user = "root"\nssh_options = [{opts}]\nworkdir = "{ROOT}"'
    return f"""
[cluster]
name = "{name}"
keys_dir = "{keys}"
port_range = "6100-6199"

[hosts.head]
address = "{hosts.addresses[head]}"
launcher = "local"

[hosts.env1]
address = "{hosts.addresses[env1]}"
{remote}

[hosts.env2]
address = "{hosts.addresses[env2]}"
{remote}

[roles.coordinator]
host = "head"

[roles.broker]
host = "head"

[roles.learner]
hosts = {json.dumps(list(learner))}

[[roles.env_workers]]
host = "env1"
count = {per_host}
vms = 1

[[roles.env_workers]]
host = "env2"
count = {per_host}
vms = 1
"""


class Launcher:
    """`bin/launch_cluster` running (in the head host's namespace, or here), its output line by line."""

    def __init__(self, argv: list[str], env: dict[str, str], netns: str = "") -> None:
        prefix = ["ip", "netns", "exec", netns] if netns else []
        self.proc = subprocess.Popen(
            [*prefix, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=ROOT,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait_for(self, text: str, timeout: float = 300.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no {text!r} within {timeout} s:\n" + "\n".join(self.lines[-60:])
                ) from None
            if line is None:
                raise AssertionError(f"the launcher ended before {text!r}:\n" + "\n".join(self.lines[-60:]))
            self.lines.append(line)
            if text in line:
                return line

    def finish(self, timeout: float = 400.0) -> int:
        code = self.proc.wait(timeout)
        while (line := self._q.get(timeout=30)) is not None:
            self.lines.append(line)
        return code

    def output(self) -> str:
        return "\n".join(self.lines)


def control(cluster: Path, env: dict[str, str], *args: str) -> dict:
    out = subprocess.run([*LAUNCH, str(cluster), *args], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def until(check, what: str, timeout: float = 60.0):
    """Poll `check()` (another process's state: nothing to block on) until it is truthy."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def leftovers(name: str, run_root: Path, pids: list[int]) -> list[str]:
    """Processes of the cluster still alive: its agents, anything under its run directory (the local
    desktops: bwrap, Xvfb and the apps run in VM directories there), and the launcher's children."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    markers = (f"guirl.cluster.agent --cluster {name} ", f"guirl.learner.trainer --cluster {name} ")
    left = [
        line.strip()
        for line in out.splitlines()
        if (any(m in line for m in markers) or str(run_root) in line) and "ps -eo" not in line
    ]
    for pid in pids:
        if pid and Path(f"/proc/{pid}").exists():
            stat = Path(f"/proc/{pid}/stat").read_text().split()
            if stat[2] != "Z":
                left.append(f"{pid} (an actor of the run)")
    return left


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "GUIRL_STATE_DIR": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}


ROGUE = """
import sys, zmq
from tests.helpers import shared_tiny
ctx = zmq.Context()
plain = ctx.socket(zmq.DEALER); plain.connect(sys.argv[1]); plain.send(b"hello")
public, secret = zmq.curve_keypair()
stranger = ctx.socket(zmq.DEALER)
stranger.curve_publickey, stranger.curve_secretkey = public, secret
stranger.curve_serverkey = sys.argv[2].encode()
stranger.connect(sys.argv[1]); stranger.send(b"hello")
got = plain.poll(2000) or stranger.poll(2000)
print("answered" if got else "silent", flush=True)
sys.stdin.read()
"""


def test_a_train_run_across_three_hosts(tmp_path, hosts, keys, tiny_ckpt):
    """The whole small cluster: readiness, live status, sockets only on the configured interfaces, strangers
    refused and counted, a worker added and one removed mid-run, one env host's processes SIGKILLed (its
    episodes handed out again, every update made), and nothing left on any host afterwards."""
    from guirl.runtime.security import load_keys

    head, env1, env2 = hosts.names
    name = f"t{hosts.prefix}a"
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(ssh_cluster(hosts, keys, name, learner=("head", "env2")))  # 2 ranks across 2 hosts
    env = _env(tmp_path)
    argv = [*LAUNCH, str(cluster), "--mode", "train", "--status-interval", "3"]
    sets = [
        f"run.root_dir={tmp_path / 'runs'}",
        f"model.hf_ckpt={tiny_ckpt}",
        "train.updates=8",
        "agent.max_steps=2",
    ]
    run = Launcher([*argv, *[x for s in sets for x in ("--set", s)]], env, netns=head)
    try:
        run.wait_for("env worker(s), 2 VMs up")
        run.wait_for("[cluster] " + name + " status")
        status = run.wait_for("hosts: ")
        assert "head load" in status and "env1 load" in status and "env2 load" in status

        # strangers: a plain peer and a CURVE peer with its own keys, from env2's namespace
        coordinator = f"tcp://{hosts.addresses[head]}:6100"
        rogue = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                env2,
                sys.executable,
                "-c",
                ROGUE,
                coordinator,
                load_keys(keys).public.decode(),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        counted = until(
            lambda: (
                (c := control(cluster, env, "--status")["coordinator"]).get("security.refused", 0) >= 1
                and c.get("security.handshake_failed", 0) >= 1
                and c
            ),
            "the strangers refused and counted",
        )
        rogue.stdin.close()
        assert rogue.stdout.readline().strip() == "silent"
        rogue.wait(30)
        assert counted["security.refused"] >= 1

        # live scaling: one more worker on env2, then one taken off it
        added = control(cluster, env, "--add", "--workers", "1", "--host", "env2")
        assert added == {"ok": True, "added": ["worker2"]}
        assert control(cluster, env, "--status")["workers"] == {
            "worker0": "env1",
            "worker1": "env2",
            "worker2": "env2",
        }

        # only the configured interfaces listen (loopback inside a host for its own desktops' servers)
        run.wait_for("[train] version 1/8")
        for ns in hosts.names:
            for address, port, proc in hosts.listening(ns):
                assert address in (hosts.addresses[ns], "127.0.0.1"), (ns, address, port, proc)

        # env1's processes all SIGKILLed mid-run: the supervisor starts its worker again, episodes retried
        killed = subprocess.run(
            ["pkill", "-KILL", "-f", f"guirl[.]cluster[.]agent --cluster {name} --host env1 "]
        )
        assert killed.returncode == 0
        removed = control(cluster, env, "--remove", "env_worker=1", "--host", "env2")
        assert removed == {"ok": True, "removed": ["worker2"]}
        after = until(
            lambda: (s := control(cluster, env, "--status"))["actors"]["worker0"]["restarts"] >= 1 and s,
            "worker0 started again on env1",
            timeout=120,
        )
        assert after["workers"] == {"worker0": "env1", "worker1": "env2"}
        pids = [a["pid"] for a in after["actors"].values()]
        code = run.finish()
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
            subprocess.run([*LAUNCH, str(cluster), "--down"], env=env, capture_output=True, timeout=300)
    out = run.output()
    assert code == 0, out[-5000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 8 and summary["final_version"] == 8, out[-3000:]
    assert "added worker2 on env2" in out and "removed worker2 from env2" in out
    # the learner's second rank ran on env2, started by rank 0 through ssh, and followed every update
    assert "learner rank 1 of 2 ready" in (run_dir / "logs" / "learner-rank1.log").read_text()
    final = json.loads((run_dir / "coordinator.json").read_text())
    assert final  # the coordinator's schedule was saved
    assert f"[cluster] {name} torn down on 3 host(s)" in out
    until(
        lambda: not leftovers(name, tmp_path / "runs", pids), "every process of the cluster gone", timeout=90
    )


def _start_long(tmp_path: Path, hosts: NetnsHosts, keys: Path, name: str) -> tuple[Launcher, Path]:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(ssh_cluster(hosts, keys, name))
    # an evaluation whose (scripted) policy takes 300 s per step: every role up, desktops running, no end
    sets = [
        f"run.root_dir={tmp_path / 'runs'}",
        "inference.backend=scripted",
        "inference.scripted.latency_s=300",
    ]
    argv = [*LAUNCH, str(cluster), "--mode", "eval", *[x for s in sets for x in ("--set", s)]]
    run = Launcher(argv, _env(tmp_path), netns=hosts.names[0])
    run.wait_for("env worker(s), 2 VMs (1/1) up")
    run.wait_for("running 2")  # both desktops in an episode
    return run, cluster


@pytest.mark.parametrize("how", ["ctrl-c", "sigkill-then-down"])
def test_teardown_leaves_nothing_on_any_host(tmp_path, hosts, keys, how):
    name = f"t{hosts.prefix}{'c' if how == 'ctrl-c' else 'k'}"
    run, cluster = _start_long(tmp_path, hosts, keys, name)
    env = _env(tmp_path)
    try:
        status = control(cluster, env, "--status")
        pids = [a["pid"] for a in status["actors"].values()]
        assert {a["host"] for a in status["actors"].values()} == {"head", "env1", "env2"}
        if how == "ctrl-c":
            os.killpg(run.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does to the foreground job
            code = run.finish(timeout=180)
            assert code == 130, run.output()[-3000:]
            assert f"[cluster] {name} torn down on 3 host(s)" in run.output()
        else:
            os.kill(run.proc.pid, signal.SIGKILL)  # the launcher alone, no chance to clean up
            run.proc.wait(30)
            down = subprocess.run(
                [*LAUNCH, str(cluster), "--down"], env=env, capture_output=True, text=True, timeout=300
            )
            assert down.returncode == 0 and f"[cluster] {name} down on 3 host(s)" in down.stdout, down
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
    until(
        lambda: not leftovers(name, tmp_path / "runs", pids), "every process of the cluster gone", timeout=90
    )
    assert not (tmp_path / "state" / f"{name}.sock").exists()


def test_a_role_that_cannot_start_fails_the_launch_with_its_log(tmp_path, hosts, keys):
    """env2's guirl install is missing: its worker's start fails with what the host said, the launch ends
    with an error, and what had started (broker, env1's worker and desktop) is torn down."""
    name = f"t{hosts.prefix}f"
    cluster = tmp_path / "cluster.toml"
    text = ssh_cluster(hosts, keys, name)
    head, env1, env2 = hosts.names
    text = text.replace(
        f'[hosts.env2]\naddress = "{hosts.addresses[env2]}"',
        f'[hosts.env2]\naddress = "{hosts.addresses[env2]}"\npython = "/nonexistent/bin/python"',
    )
    cluster.write_text(text)
    sets = [
        f"run.root_dir={tmp_path / 'runs'}",
        "inference.backend=scripted",
        "inference.scripted.latency_s=300",
    ]
    argv = [*LAUNCH, str(cluster), "--mode", "eval", *[x for s in sets for x in ("--set", s)]]
    run = Launcher(argv, _env(tmp_path), netns=head)
    code = run.finish(timeout=180)
    out = run.output()
    assert code == 1, out[-3000:]
    assert "an env worker did not start: actor worker1 exited with 127 before ready; its log ends" in out
    assert "/nonexistent/bin/python" in out and f"[cluster] {name} torn down on 3 host(s)" in out
    until(lambda: not leftovers(name, tmp_path / "runs", []), "every process of the cluster gone", timeout=60)


def test_control_requests_are_checked(tmp_path, hosts, keys):
    """Bad --add/--remove input is a clear error before anything is sent, and a launcher that is not running
    is said to be so; hostile lines on the control socket are answered with an error (see the unit tests)."""
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(ssh_cluster(hosts, keys, f"t{hosts.prefix}x"))
    env = _env(tmp_path)
    for args, message in [
        (["--add", "--workers", "1"], "need --host"),
        (["--add", "--host", "env1"], "--add needs --workers N"),
        (["--add", "env_worker=1", "--workers", "2", "--host", "env1"], "give the count once"),
        (["--add", "env_worker=x", "--host", "env1"], "whole number"),
        (["--add", "gpu=1", "--host", "env1"], "expected --add --workers N (or env_worker=N)"),
        (["--remove", "env_worker=1", "--host", "mars"], "no such host"),
        (["--add", "env_worker=1", "--host", "env1"], "is not running here"),
        (["--status"], "is not running here"),
    ]:
        out = subprocess.run(
            [*LAUNCH, str(cluster), *args], capture_output=True, text=True, env=env, timeout=60
        )
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)


# -- Slurm -------------------------------------------------------------------------------------------------


@pytest.mark.skipif(bool(can_run_slurm()), reason=can_run_slurm() or "")
def test_the_small_cluster_through_slurm(tmp_path, keys, tiny_ckpt):
    """Broker, learner and two env workers as Slurm job steps on the node; the coordinator in the launcher.
    A finished run leaves no step; a SIGKILLed launcher's steps are cancelled by --down, also when the
    launcher ran inside an allocation (its steps are that job's, which --down leaves allocated)."""
    with SlurmNode(tmp_path / "slurm") as slurm:
        base_env = {**slurm.env, "GUIRL_STATE_DIR": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
        job = slurm.allocate()
        runs = (
            (f"s{os.getpid()}", "train", ""),
            (f"s{os.getpid()}k", "eval", ""),
            (f"s{os.getpid()}a", "eval", job),
        )
        for name, mode, allocation in runs:
            env = {**base_env, "SLURM_JOB_ID": allocation} if allocation else base_env

            def steps(name: str = name, allocation: str = allocation) -> list[str]:
                return slurm.steps(allocation, f"guirl-{name}") if allocation else slurm.jobs(f"guirl-{name}")

            cluster = tmp_path / f"{name}.toml"
            cluster.write_text(
                f"""
[cluster]
name = "{name}"
keys_dir = "{keys}"
port_range = "6200-6299"

[hosts.login]
address = "127.0.0.1"

[hosts.node]
address = "127.0.0.1"
launcher = "slurm"
slurm_node = "{SlurmNode.NODE}"
workdir = "{ROOT}"

[roles.coordinator]
host = "login"

[roles.broker]
host = "node"

[roles.learner]
hosts = ["node"]

[[roles.env_workers]]
host = "node"
count = 2
vms = 1
"""
            )
            root = tmp_path / name
            sets = [
                f"run.root_dir={root}",
                f"model.hf_ckpt={tiny_ckpt}",
                "train.updates=2",
                "agent.max_steps=2",
            ]
            if mode == "eval":  # a run that does not end: a scripted policy taking 300 s per step
                sets += ["inference.backend=scripted", "inference.scripted.latency_s=300"]
            run = Launcher(
                [*LAUNCH, str(cluster), "--mode", mode, *[x for s in sets for x in ("--set", s)]], env
            )
            try:
                run.wait_for("env worker(s), 2 VMs")
                # broker, learner, worker0, worker1 (no learner in an evaluation)
                assert len(steps()) == (4 if mode == "train" else 3), steps()
                if mode == "train":
                    code = run.finish()
                    assert code == 0, run.output()[-4000:]
                    (run_dir,) = root.iterdir()
                    assert json.loads((run_dir / "summary.json").read_text())["updates"] == 2
                else:
                    os.kill(run.proc.pid, signal.SIGKILL)
                    run.proc.wait(30)
                    down = subprocess.run(
                        [*LAUNCH, str(cluster), "--down"],
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=300,
                    )
                    assert down.returncode == 0, down.stderr
            finally:
                if run.proc.poll() is None:
                    os.killpg(run.proc.pid, signal.SIGKILL)
            until(lambda s=steps: not s(), "no Slurm step of the cluster left", timeout=90)
            if allocation:
                assert any(row.split()[0] == allocation for row in slurm.jobs()), "--down took the allocation"
            until(
                lambda n=name, r=root: not leftovers(n, r, []), "no process of the cluster left", timeout=90
            )
