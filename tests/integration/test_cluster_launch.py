"""The launchers' process interface, the agent's stdio protocol, the cluster's placement and the control
socket here, with real processes and a real Unix socket (across hosts: tests/e2e/test_cluster.py)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from guirl.cluster.agent import read_payload
from guirl.cluster.launch import (
    ActorStartError,
    CommandLauncher,
    SlurmLauncher,
    SSHLauncher,
    agent_payload,
)
from guirl.cluster.run import ClusterRun, control_path
from guirl.cluster.spec import ClusterFileError, Host, parse_cluster
from guirl.config import load_config
from guirl.runtime.process import ActorOptionsError, ActorSpec
from guirl.runtime.supervisor import Supervisor
from tests.helpers import CLOUD_ENV, run

ROOT = Path(__file__).resolve().parents[2]


ECHO = "guirl.actors.echo:EchoActor"


def _echo(host: str = "") -> ActorSpec:
    """An echo actor on a random loopback port, on `host`."""
    return ActorSpec(name="echo", target=ECHO, bind=["tcp://127.0.0.1:0"], host=host)


class DirectLauncher(CommandLauncher):
    """The agent run here with no ssh or srun around it: the command path without a remote host."""

    def wrap(self, argv: list[str]) -> list[str]:
        return argv


def _cluster(**over) -> dict:
    raw = {
        "cluster": {"name": "t", "keys_dir": "keys", "port_range": "7000-7010"},
        "hosts": {
            "head": {"address": "10.1.0.1"},
            "cpu": {"address": "10.1.0.2", "launcher": "ssh"},
        },
        "roles": {
            "coordinator": {"host": "head"},
            "broker": {"host": "head"},
            "learner": {"hosts": ["head"], "gpus_per_host": 2},
            "env_workers": [{"host": "cpu", "count": 3, "vms": 4}, {"host": "head", "count": 1, "vms": 2}],
        },
    }
    raw.update(over)
    return raw


# -- launch commands -------------------------------------------------------------------------------------


def test_ssh_and_srun_commands():
    host = Host(
        address="10.0.0.2",
        launcher="ssh",
        python="/opt/g/.venv/bin/python",
        workdir="/srv/my guirl",
        ssh_user="guirl",
        ssh_port=2222,
        ssh_options=["IdentityFile=/k/id"],
    )
    argv = SSHLauncher("cpu1", host, "c1").start(b"s", b"c", "worker3").argv
    assert argv[:2] == ["ssh", "-T"] and "BatchMode=yes" in argv and argv[argv.index("-p") + 1] == "2222"
    assert "IdentityFile=/k/id" in argv and argv[-2] == "guirl@10.0.0.2"
    assert argv[-1] == (
        "cd '/srv/my guirl' && exec env GUIRL_HOST_ADDRESS=10.0.0.2 PYTHONUNBUFFERED=1 "
        "/opt/g/.venv/bin/python -m guirl.cluster.agent --cluster c1 --host cpu1 --actor worker3"
    )
    slurm = Host(
        address="10.0.0.3", launcher="slurm", slurm_node="n7", slurm_args=["--partition=cpu"], workdir="/w"
    )
    argv = SlurmLauncher("n", slurm, "c1").start(b"s", b"c", "broker").argv
    assert argv[:3] == ["srun", "--nodes=1", "--ntasks=1"] and "--job-name=guirl-c1" in argv
    assert "--nodelist=n7" in argv and "--chdir=/w" in argv and "--partition=cpu" in argv
    assert "--export=ALL,GUIRL_HOST_ADDRESS=10.0.0.3,PYTHONUNBUFFERED=1" in argv
    assert argv[-6:] == ["--cluster", "c1", "--host", "n", "--actor", "broker"]
    assert argv.index("-o") < argv.index("IdentityFile=/k/id") if "IdentityFile=/k/id" in argv else True


def test_ssh_options_of_the_host_come_first_and_srun_overlaps_inside_an_allocation(monkeypatch):
    host = Host(address="10.0.0.2", launcher="ssh", ssh_options=["ConnectTimeout=3"])
    argv = SSHLauncher("h", host, "c").start(b"s", b"c", "w").argv
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert opts.index("ConnectTimeout=3") < opts.index("ConnectTimeout=15")  # ssh keeps the first
    assert argv[argv.index("--") + 1] == "10.0.0.2"
    slurm = Host(address="10.0.0.3", launcher="slurm")
    assert "--overlap" not in SlurmLauncher("n", slurm, "c").start(b"s", b"c", "w").argv
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert "--overlap" in SlurmLauncher("n", slurm, "c").start(b"s", b"c", "w").argv


# -- the agent's protocol --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, error",
    [
        (b"", "no spec on stdin"),
        (b"not base64!\n", "not base64 msgpack"),
        (base64.b64encode(b"\xc1") + b"\n", "not base64 msgpack"),
        (base64.b64encode(msgspec.msgpack.encode({"a": 1})) + b"\n", "[spec bytes, config bytes]"),
        (base64.b64encode(msgspec.msgpack.encode([b"x"])) + b"\n", "[spec bytes, config bytes]"),
    ],
)
def test_a_bad_spec_line_is_a_clear_error(line, error):
    with pytest.raises(ValueError, match=error.replace("[", r"\[").replace("]", r"\]")):
        read_payload(io.BytesIO(line))


def _agent(stdin: bytes, actor: str = "echo") -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "guirl.cluster.agent", "--cluster", "t", "--host", "h", "--actor", actor]
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=60, cwd=ROOT)


@pytest.mark.parametrize(
    "spec, actor, error",
    [
        (ActorSpec(name="echo", target="os:system"), "echo", "is not one of guirl's actors"),
        (ActorSpec(name="echo", target=ECHO), "other", "the spec is for 'echo'"),
    ],
)
def test_the_agent_refuses_what_it_must_not_run(spec, actor, error):
    cfg = load_config(None)
    out = _agent(agent_payload(msgspec.msgpack.encode(spec), msgspec.msgpack.encode(cfg)), actor)
    assert out.returncode == 2 and error in out.stderr.decode() and out.stdout == b""


def test_the_agent_refuses_a_garbled_spec():
    out = _agent(b"\x00\xff garbage\n")
    assert out.returncode == 2 and "not base64 msgpack" in out.stderr.decode()
    cfg = msgspec.msgpack.encode(load_config(None))
    out = _agent(agent_payload(b"\x93not a spec", cfg))
    assert out.returncode == 2 and "guirl.cluster.agent" in out.stderr.decode()


def test_an_actor_over_the_command_path(tmp_path):
    """Ready with its endpoints, supervised (a SIGKILL is restarted), stopped by closing its stdin (the
    agent's lifeline) with a clean exit report; an actor that cannot start fails with its log tail."""
    cfg = load_config(None, overrides=["supervisor.restart_backoff_initial_s=0.05"])
    launcher = DirectLauncher("here", Host(address="127.0.0.1"), "t")

    async def main():
        async with Supervisor(cfg, run_dir=str(tmp_path), launchers={"here": launcher}) as sup:
            spec = _echo("here")
            handle = await sup.start(spec)
            assert handle.endpoints[0].startswith("tcp://127.0.0.1:") and handle.pid > 0
            first, endpoints = handle.pid, list(handle.endpoints)
            after = len(sup.history)
            os.kill(first, signal.SIGKILL)
            await sup.wait_event("restarted", "echo", after=after, timeout=60)
            assert handle.pid != first and handle.endpoints == endpoints  # the same port, bound again
            after = len(sup.history)
            await sup.stop("echo")
            ev = await sup.wait_event("stopped", "echo", after=after, timeout=5)
            assert ev.kind == "stopped"
            # an address the host cannot bind (TEST-NET-1): the actor fails on the host, and says why
            bad = ActorSpec(name="bad", target=ECHO, bind=["tcp://192.0.2.1:5555"], host="here")
            with pytest.raises(ActorStartError, match="exited with 1 before ready; its log ends") as err:
                await sup.start(bad)
            assert "192.0.2.1" in str(err.value)
            # a target that does not load is refused here, before any command runs
            with pytest.raises(ActorOptionsError, match="NoSuchActor"):
                await sup.start(ActorSpec(name="bad2", target="guirl.actors.echo:NoSuchActor", host="here"))
            with pytest.raises(ActorStartError, match="no launcher for host 'mars'"):
                await sup.start(ActorSpec(name="x", target=ECHO, host="mars"))

    run(main(), timeout=120)


class NoisyLauncher(CommandLauncher):
    """The agent behind a command that first prints a JSON object that is not a report on stdout, and a
    line longer than the reader's limit on stderr."""

    def wrap(self, argv: list[str]) -> list[str]:
        noise = "echo '{\"status\": \"ok\"}'; head -c 2000000 /dev/zero | tr '\\0' x >&2; echo >&2"
        return ["sh", "-c", noise + '; exec "$@"', "sh", *argv]


def test_noise_before_ready_is_log_and_a_huge_line_does_not_stop_the_reader(tmp_path):
    cfg = load_config(None)
    launcher = NoisyLauncher("noisy", Host(address="127.0.0.1"), "t")

    async def main():
        async with Supervisor(cfg, run_dir=str(tmp_path), launchers={"noisy": launcher}) as sup:
            spec = _echo("noisy")
            handle = await sup.start(spec)
            tail = handle.process.log_tail()
            assert '{"status": "ok"}' in tail and "a line over 1 MiB was dropped" in tail
            # stopped twice at once (a --remove racing the end of the run): one stop, no error
            codes = await asyncio.gather(sup.stop("echo"), sup.stop("echo"))
            assert codes == [0, 0] and not sup.actors
            assert await sup.stop("echo") is None  # and once more, when it is gone

    run(main(), timeout=60)


class SilentLauncher(CommandLauncher):
    """A host whose command never reports ready (it prints a line of log, then waits)."""

    def wrap(self, argv: list[str]) -> list[str]:
        return ["sh", "-c", "echo 'loading something slow' >&2; exec sleep 60"]


def test_a_role_silent_past_its_timeout_fails_with_its_log_tail(tmp_path):
    cfg = load_config(None, overrides=["supervisor.start_timeout_s=1"])
    launcher = SilentLauncher("slow", Host(address="127.0.0.1"), "t")

    async def main():
        async with Supervisor(cfg, run_dir=str(tmp_path), launchers={"slow": launcher}) as sup:
            spec = ActorSpec(name="broker", target=ECHO, host="slow")
            with pytest.raises(
                ActorStartError, match="not ready within 1.0 s; its log ends:\nloading something"
            ):
                await sup.start(spec)
            assert not sup.actors

    run(main(), timeout=60)
    left = subprocess.run(["pgrep", "-f", "loading something slow"], capture_output=True)
    assert left.returncode == 1  # the silent command was killed, not left behind


def test_closing_stdin_stops_the_agent_cleanly(tmp_path):
    cfg = load_config(None)
    spec = _echo()
    argv = [sys.executable, "-m", "guirl.cluster.agent", "--cluster", "t", "--host", "h", "--actor", "echo"]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
    )
    proc.stdin.write(agent_payload(msgspec.msgpack.encode(spec), msgspec.msgpack.encode(cfg)))
    proc.stdin.flush()
    ready = json.loads(proc.stdout.readline())
    assert ready["ready"] == "echo" and ready["pid"] == proc.pid and ready["host"] == "h"
    proc.stdin.close()
    assert proc.wait(30) == 0
    reports = [json.loads(x) for x in proc.stdout.read().splitlines()]
    assert {"exit": "shutdown", "reason": "SIGTERM"} in reports


# -- placement -------------------------------------------------------------------------------------------


def test_a_cluster_places_every_role(tmp_path):
    cluster = ClusterRun(parse_cluster(_cluster()), base_dir=tmp_path)
    cfg = cluster.apply(load_config(None))
    assert (
        cfg.endpoints.coordinator == "tcp://10.1.0.1:7000" and cfg.endpoints.broker == "tcp://10.1.0.1:7001"
    )
    assert cfg.endpoints.learner == "tcp://10.1.0.1:7002"
    assert cfg.runtime.curve_keys_dir == str(tmp_path / "keys")
    assert cfg.env.workers == 4 and cfg.env.max_envs == 14 and cfg.train.ranks == 2
    assert cluster.slots == [("cpu", 4)] * 3 + [("head", 2)]
    spec = cluster.on_host(ActorSpec(name="worker0", target="guirl.x:Y"), "cpu")
    assert spec.host == "cpu" and spec.env == {"GUIRL_HOST_ADDRESS": "10.1.0.2"}
    assert set(cluster.launchers) == {"head", "cpu"}


def test_the_one_host_cluster_leaves_the_config_alone():
    cfg = load_config(None, overrides=["env.workers=3", "env.max_envs=7"])
    cluster = ClusterRun.local(cfg)
    assert cluster.apply(cfg) is cfg and cluster.slots == [("local", 3), ("local", 2), ("local", 2)]
    spec = cluster.on_host(ActorSpec(name="w", target="guirl.x:Y"), "local")
    assert spec.host == "local" and spec.env == {}


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"hosts": {"head": {"address": "10.1.0.1", "launcher": "ssh"}, "cpu": {"address": "10.1.0.2"}}},
            "coordinator",
        ),
    ],
)
def test_the_coordinator_runs_in_the_launcher(change, message):
    with pytest.raises(ClusterFileError, match='must have launcher = "local"'):
        ClusterRun(parse_cluster(_cluster(**change)))


@pytest.mark.parametrize(
    "where, value, message",
    [
        (("cluster", "name"), "a b", "cluster.name 'a b': letters, digits"),
        (("cluster", "name"), "x'; rm -rf /", "letters, digits"),
        (("cluster", "name"), "../up", "letters, digits"),
        (("hosts", "cpu", "address"), "fd00::2", "hosts.cpu.address: fd00::2 is IPv6"),
        (("hosts", "cpu", "ssh_user"), "-oProxyCommand=x", "hosts.cpu.ssh_user: '-oProxyCommand=x' may not"),
    ],
)
def test_names_and_addresses_that_would_reach_a_shell_or_a_path_are_refused(where, value, message):
    raw = _cluster()
    node = raw
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    with pytest.raises(ClusterFileError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_cluster(raw)


def test_a_learner_host_listed_twice_is_refused():
    raw = _cluster()
    raw["roles"]["learner"]["hosts"] = ["head", "head"]
    with pytest.raises(ClusterFileError, match="roles.learner.hosts: a host is listed twice"):
        parse_cluster(raw)


def test_learner_ranks_across_hosts(tmp_path):
    """Rank 0 (the learner actor) on the first host starts the others: its own host's as children, the
    other hosts' through their launchers, all meeting at the cluster's learner.master port."""
    raw = _cluster()
    raw["roles"]["learner"] = {"hosts": ["head", "cpu"], "gpus_per_host": 2}
    cluster = ClusterRun(parse_cluster(raw), base_dir=tmp_path)
    cfg = cluster.apply(load_config(None))
    assert cfg.train.ranks == 4
    from guirl.roles import learner_spec
    from guirl.runtime.process import check_options

    spec = cluster.place(learner_spec(cfg, tmp_path, "/ckpt", "tcp://b:1", "tcp://c:2"), "learner")
    assert spec.host == "head" and spec.env == {"GUIRL_HOST_ADDRESS": "10.1.0.1"}
    options = check_options(spec)  # what the learner's process is given, as the supervisor checks it
    placed = options.follower_hosts
    assert placed[0] is None and [p.host for p in placed[1:]] == ["cpu", "cpu"]
    assert [p.local_rank for p in placed[1:]] == [0, 1] and placed[1].cluster == "t"
    assert placed[1].spec == cluster.spec.hosts["cpu"] and options.ranks == 4
    assert options.master_port == cluster.ports[("head", "learner.master")] == 7003


def test_hosts_on_one_address_share_its_ports():
    raw = _cluster()
    raw["hosts"]["cpu"]["address"] = "10.1.0.1"
    raw["roles"]["broker"]["host"] = "cpu"
    ports = parse_cluster(raw).ports()
    assert len({ports[k] for k in ports if k[1] != "learner.master"}) == 3


# -- the control socket -----------------------------------------------------------------------------------


async def _ask(name: str, raw: bytes) -> dict:
    reader, writer = await asyncio.open_unix_connection(str(control_path(name)))
    writer.write(raw)
    await writer.drain()
    line = await reader.readline()
    writer.close()
    return json.loads(line)


def test_the_control_socket_answers_hostile_requests(tmp_path, monkeypatch):
    monkeypatch.setenv("GUIRL_STATE_DIR", str(tmp_path / "state"))
    cluster = ClusterRun(parse_cluster(_cluster()), base_dir=tmp_path, control=True)
    cfg = load_config(None)
    started = []

    def make_worker(index: int, vms: int) -> ActorSpec:
        started.append((index, vms))
        raise RuntimeError("no workers in this test")

    async def main():
        async with Supervisor(cfg, run_dir=str(tmp_path)) as sup:
            await cluster.serve(sup, make_worker, io.StringIO())
            name = cluster.name
            assert oct(control_path(name).stat().st_mode & 0o777) == "0o600"
            for raw, error in [
                (b"not json\n", "Expecting value"),
                (b"[1, 2]\n", "expected {"),
                (b'{"op": "reboot"}\n', "expected {"),
                (b'{"op": "add", "host": "mars", "count": 1}\n', "host 'mars' is not in the cluster file"),
                (b'{"op": "add", "host": "cpu", "count": 0}\n', "count 0"),
                (b'{"op": "add", "host": "cpu", "count": true}\n', "count True"),
                (b'{"op": "add", "host": "cpu", "count": "3"}\n', "count '3'"),
                (b'{"op": "add", "host": "cpu", "count": 1, "vms": 9999}\n', "vms 9999"),
                (b'{"op": "remove", "host": "cpu", "count": 2}\n', "runs 0 env worker(s), not 2"),
                (b'{"op": "add", "host": "cpu", "count": 1}\n', "no workers in this test"),
                (b"x" * 10000 + b"\n", ""),
            ]:
                reply = await _ask(name, raw)
                assert reply["ok"] is False and error in reply["error"], (raw[:60], reply)
            assert started == [(4, 4)]  # the one well-formed add reached make_worker, with the host's VMs
            status = await _ask(name, b'{"op": "status"}\n')
            assert status["ok"] and status["workers"] == {} and status["actors"] == {}
            await cluster.close()
            assert not control_path(name).exists()

    run(main(), timeout=60)


# -- GPUs named in the cluster file -------------------------------------------------------------------------


def _osworld(name: str):
    return load_config(ROOT / "configs" / name, env=CLOUD_ENV)


def _gpu_cluster(**roles) -> ClusterRun:
    raw = _cluster()
    raw["hosts"]["gpu1"] = {"address": "10.1.0.3", "launcher": "ssh"}
    raw["roles"]["broker"] = {"host": "gpu1", "gpus": [4, 5, 6, 7]}
    raw["roles"]["learner"] = {"hosts": ["head"], "gpus": [0, 1, 2, 3]}
    raw["roles"].update(roles)
    return ClusterRun(parse_cluster(raw))


def test_gpus_named_per_role_place_each_process_on_its_own():
    """Learner ranks on GPUs 0-3 of their host, the broker's SGLang servers on 4-7 of another: each process
    sees only its role's GPUs, so hf engines count ordinals from 0 there."""
    cluster = _gpu_cluster()
    cfg = cluster.prepare(_osworld("osworld_qwen3vl_8b_rl.toml"), "train")
    assert cfg.train.ranks == 4
    laid = cluster.plan(cfg, "train")
    assert laid.learner_gpus == ("0", "1", "2", "3") and laid.learner_env() == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3"
    }
    assert [e.gpus for e in laid.rollout] == [
        ("4",),
        ("5",),
        ("6",),
        ("7",),
    ]  # CUDA_VISIBLE_DEVICES of a server
    assert [e.ordinals for e in laid.rollout] == [(0,), (1,), (2,), (3,)]
    broker = cluster.place(ActorSpec(name="broker", target="guirl.actors.broker:InferenceBroker"), "broker")
    assert broker.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7" and broker.host == "gpu1"
    # the same physical ids on two hosts, and the judge on the broker's host after its rollout GPUs
    prm = {"host": "gpu1", "gpus": [3]}
    cluster = _gpu_cluster(broker={"host": "gpu1", "gpus": [0, 1, 2]}, prm=prm)
    cfg = cluster.prepare(_osworld("osworld_qwen3vl_8b_prm_rl.toml"), "train")
    laid = cluster.plan(cfg, "train")
    assert laid.learner_gpus == ("0", "1", "2", "3")
    assert [e.gpus for e in laid.rollout] == [("0",), ("1",), ("2",)] and [e.gpus for e in laid.judge] == [
        ("3",)
    ]
    assert [e.ordinals for e in laid.judge] == [(3,)]
    assert (
        cluster.place(ActorSpec(name="broker", target="x.y:Z"), "broker").env["CUDA_VISIBLE_DEVICES"]
        == "0,1,2,3"
    )
    # eval: no learner, the broker's GPUs only
    cluster = _gpu_cluster()
    laid = cluster.plan(
        cluster.prepare(_osworld("osworld_qwen3vl_4b_eval.toml"), "eval"),
        "eval",
    )
    assert [e.gpus for e in laid.rollout] == [("4",), ("5",), ("6",), ("7",)] and laid.learner_gpus == ()


@pytest.mark.parametrize(
    "learner, ranks",
    [({"hosts": ["head", "gpu1"], "gpus": [0, 1, 2, 3]}, 8), ({"hosts": ["head"], "gpus": [0, 1]}, 2)],
)
def test_the_learner_gpus_of_the_cluster_file_replace_the_configs_counts(learner, ranks):
    """The config says 4 actor GPUs (ACTOR_GPUS, train.ranks); a cluster file naming the learner's GPUs
    decides instead: on two hosts, or fewer on one."""
    cluster = _gpu_cluster(learner=learner)
    cfg = _osworld("osworld_qwen3vl_8b_rl.toml")
    assert cfg.cluster.actor_gpus == 4
    cfg = cluster.prepare(cfg, "train")
    assert cfg.train.ranks == ranks
    assert len(cluster.plan(cfg, "train").learner_gpus) == len(learner["gpus"])


@pytest.mark.parametrize(
    "roles, message",
    [
        ({"learner": {"hosts": ["head"]}}, "roles.learner.gpus: the cluster file names the engines' GPUs"),
        ({"prm": {"host": "gpu1", "gpus": [7]}}, "roles.prm.gpus: GPU(s) [7] are the broker's too"),
        ({"broker": {"host": "gpu1", "gpus": [4, 4]}}, "roles.broker.gpus: [4, 4] lists a GPU twice"),
        ({"broker": {"host": "head", "gpus": [3, 4]}}, "roles.learner.gpus: GPU(s) [3] of host 'head'"),
        (
            {"learner": {"hosts": ["head"], "gpus": [0, 1], "gpus_per_host": 4}},
            "2 GPU(s), but gpus_per_host is 4",
        ),
        ({"coordinator": {"host": "head", "gpus": [0]}}, "the coordinator uses no GPU"),
    ],
)
def test_gpu_ids_that_cannot_work_are_refused(roles, message):
    with pytest.raises(ClusterFileError, match=re.escape(message)):
        cluster = _gpu_cluster(**roles)
        cluster.plan(
            cluster.prepare(_osworld("osworld_qwen3vl_8b_rl.toml"), "train"),
            "train",
        )
