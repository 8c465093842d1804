"""`bin/launch_cluster`: run guirl on the machines of a cluster file, scale its env workers, tear it down.

    bin/launch_cluster CLUSTER.toml [--mode eval|train|train-prm|gui-r1] [--config CFG] [--set KEY=VALUE ...]
    bin/launch_cluster CLUSTER.toml --add --workers N --host HOST [--vms-per-worker V]
    bin/launch_cluster CLUSTER.toml --remove --workers N --host HOST
    bin/launch_cluster CLUSTER.toml --status
    bin/launch_cluster CLUSTER.toml --down

The first form is the launcher: it runs the coordinator itself and starts every other role on its host
(local children, ssh, srun), waits for each to report ready (a role that does not fails the launch with its
log tail), prints a status table every `--status-interval` seconds, and on Ctrl-C, SIGTERM or an error
stops everything on every host, then sweeps each host for anything of the cluster's left behind. The other
forms talk to a running launcher through its control socket, or (`--down`) clean up after one that was
killed: the launcher is stopped if alive, then every host is swept (agents by their command-line label,
Slurm steps by job name).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from guirl.cluster.launch import SlurmLauncher, SSHLauncher, job_name, make_launcher
from guirl.cluster.run import ClusterRun, control_path, state_path
from guirl.cluster.spec import ClusterFile, load_cluster
from guirl.errors import InputError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MODES = {
    "eval": "local_eval.toml",
    "train": "local_rl.toml",
    "train-prm": "local_prm_rl.toml",
    "gui-r1": "gui_r1.toml",
}


def parser() -> argparse.ArgumentParser:
    from guirl.cli.main import Parser

    p = Parser(
        prog="launch_cluster",
        description="Run guirl across the hosts of a cluster file (see docs/cluster.md).",
    )
    p.add_argument("cluster", help="the cluster file (TOML)")
    p.add_argument("--mode", choices=sorted(MODES), default="train", help="what to run (default: train)")
    p.add_argument("--config", help="the run's config (default: the mode's shipped local config)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--status-interval", type=float, default=10.0, help="seconds between status tables")
    act = p.add_mutually_exclusive_group()
    act.add_argument(
        "--add",
        nargs="?",
        const="",
        metavar="env_worker=N",
        help="start more env workers on --host: --add --workers N (or the older --add env_worker=N)",
    )
    act.add_argument(
        "--remove",
        nargs="?",
        const="",
        metavar="env_worker=N",
        help="stop env workers of --host: --remove --workers N (or --remove env_worker=N)",
    )
    act.add_argument("--status", action="store_true", help="ask the running launcher which workers run where")
    act.add_argument("--down", action="store_true", help="stop the cluster's processes on every host")
    p.add_argument("--workers", type=int, help="--add / --remove: how many env workers")
    p.add_argument("--host", help="the host of --add / --remove")
    p.add_argument(
        "--vms-per-worker",
        "--vms",
        dest="vms",
        type=int,
        help="--add: VMs per new env worker (default: the host's in the file)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, extras = p.parse_known_args(argv)
    if extras:
        p.unrecognized(extras)
    try:
        spec = load_cluster(args.cluster)
        if args.add is not None or args.remove is not None:
            return scale(spec, args)
        given = [f for f, v in (("--workers", args.workers), ("--vms-per-worker", args.vms)) if v is not None]
        if given:
            raise InputError(
                f"{', '.join(given)}: only with --add or --remove (the cluster file sets a launch's)"
            )
        if args.status:
            return _print_reply(control(spec.cluster.name, {"op": "status"}))
        if args.down:
            return down(spec)
        return launch(spec, args)
    except (InputError, ValueError) as exc:  # a bad cluster file, config, override or request
        print(f"launch_cluster: {exc}", file=sys.stderr)
        return 2


# -- the launcher ------------------------------------------------------------------------------------


def launch(spec: ClusterFile, args: argparse.Namespace) -> int:
    import uvloop

    from guirl.config import load_config
    from guirl.errors import RunError
    from guirl.log import setup_logging

    base = Path(args.cluster).resolve().parent
    config = args.config or str(CONFIGS / MODES[args.mode])
    overrides = list(args.set)
    if args.mode == "train-prm":
        overrides.append("prm.enabled=true")
    cfg = load_config(config, overrides=overrides)
    cluster = ClusterRun(spec, base_dir=base, control=True)
    cluster.status_interval_s = args.status_interval
    setup_logging("launch_cluster", level=cfg.logging.level, fmt=cfg.logging.format)
    name = spec.cluster.name
    if _launcher_alive(name):
        raise InputError(
            f"cluster {name!r} is already running (pid {_state(name).get('pid')}); --down stops it"
        )
    state_path(name).parent.mkdir(parents=True, exist_ok=True)
    state_path(name).write_text(
        json.dumps({"pid": os.getpid(), "cluster": str(Path(args.cluster).resolve()), "started": time.time()})
    )

    async def run() -> dict:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        # an orderly teardown on Ctrl-C and SIGTERM alike, even when started with SIGINT ignored (a
        # background job of a script inherits that, and Python then raises no KeyboardInterrupt)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        if args.mode == "eval" or (args.mode == "gui-r1" and not cfg.data.train):
            from guirl.eval import run_eval

            return await run_eval(cfg, cluster=cluster)
        from guirl.train import run_train

        return await run_train(cfg, cluster=cluster)

    code = 1
    try:
        summary = uvloop.run(run())
        code = 0 if summary.get("updates", 1) or summary.get("tasks") else 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("[cluster] interrupted: stopped every role", file=sys.stderr)
        code = 130
    except RunError as exc:
        print(f"launch_cluster: {exc}", file=sys.stderr)
    finally:
        # the teardown itself is not interrupted by a second Ctrl-C (the loop's handlers are gone by now)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        left = sweep(spec)
        print(f"[cluster] {name} torn down on {len(spec.used_hosts())} host(s){left}", file=sys.stderr)
        for path in (state_path(name), control_path(name)):
            path.unlink(missing_ok=True)
    return code


def _state(name: str) -> dict:
    try:
        data = json.loads(state_path(name).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _launcher_alive(name: str) -> bool:
    pid = _state(name).get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a recycled pid is not our launcher
        return "launch_cluster" in Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
    except OSError:
        return True


# -- control -------------------------------------------------------------------------------------------


def control(name: str, request: dict, timeout: float = 600.0) -> dict:
    path = control_path(name)
    if not path.exists():
        raise InputError(f"cluster {name!r} is not running here (no control socket {path})")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            sock.sendall(json.dumps(request).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            raise InputError(f"cluster {name!r}: its launcher did not answer: {exc}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise InputError(f"cluster {name!r}: its launcher answered {data[:200]!r}") from None
    return reply if isinstance(reply, dict) else {"ok": False, "error": "not an object"}


def _print_reply(reply: dict) -> int:
    print(json.dumps(reply))
    return 0 if reply.get("ok") else 1


def scale(spec: ClusterFile, args: argparse.Namespace) -> int:
    adding = args.add is not None
    what = args.add if adding else args.remove
    flag = "--add" if adding else "--remove"
    if what:  # the older form, env_worker=N
        role, sep, count = what.partition("=")
        if role != "env_worker" or not sep:
            raise InputError(f"{flag} {what!r}: expected {flag} --workers N (or env_worker=N)")
        if args.workers is not None:
            raise InputError(f"{flag} {what!r} and --workers {args.workers}: give the count once")
        try:
            n = int(count)
        except ValueError:
            raise InputError(f"{what!r}: N must be a whole number") from None
    elif args.workers is None:
        raise InputError(f"{flag} needs --workers N (how many env workers)")
    else:
        n = args.workers
    if not args.host:
        raise InputError("--add / --remove need --host HOST")
    if args.host not in spec.hosts:
        raise InputError(f"--host {args.host!r}: no such host in the cluster file")
    request = {"op": "add" if adding else "remove", "host": args.host, "count": n}
    if args.vms is not None and not adding:
        raise InputError("--vms-per-worker: only with --add (a removed worker takes its VMs with it)")
    if args.vms is not None:
        request["vms"] = args.vms
    return _print_reply(control(spec.cluster.name, request))


# -- teardown ------------------------------------------------------------------------------------------


def down(spec: ClusterFile) -> int:
    """Stop a running launcher (it tears down in order), then sweep every host."""
    name = spec.cluster.name
    if _launcher_alive(name):
        pid = int(_state(name)["pid"])
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _launcher_alive(name):
            time.sleep(0.2)  # polling another process's exit: there is no fd to wait on
    left = sweep(spec)
    for path in (state_path(name), control_path(name)):
        path.unlink(missing_ok=True)
    print(f"[cluster] {name} down on {len(spec.used_hosts())} host(s){left}")
    return 0


def sweep(spec: ClusterFile, grace: float = 15.0) -> str:
    """Whatever of this cluster is left on its hosts, all of them (also those only `--add` used), in
    parallel: agents and remote learner ranks (SIGTERM, then SIGKILL after `grace`) and Slurm steps
    (scancel by name). Returns a note of what had to be done ("" if nothing)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(spec.hosts))) as pool:
        notes = [n for n in pool.map(lambda h: _sweep_host(spec, h, grace), spec.hosts) if n]
    return f" ({'; '.join(notes)})" if notes else ""


def _sweep_host(spec: ClusterFile, host: str, grace: float) -> str:
    name = spec.cluster.name
    # agents, and learner ranks on other hosts, carry `--cluster NAME` on their command lines
    pattern = f"guirl[.](cluster[.]agent|learner[.]trainer) --cluster {name} "
    launcher = make_launcher(host, spec.hosts[host], name)
    if isinstance(launcher, SlurmLauncher):
        return _sweep_slurm(name, host, grace)
    wrap = launcher.run_argv if isinstance(launcher, SSHLauncher) else (lambda argv: argv)
    code = _run(wrap(["pkill", "-TERM", "-f", pattern]))
    if code == 1:  # pkill: nothing matched
        return ""
    if code != 0:
        return f"{host}: not reachable to sweep (exit {code}); check it by hand"
    loop = f"for i in $(seq {int(grace * 5)}); do pgrep -f '{pattern}' >/dev/null || exit 0; sleep 0.2; done"
    if _run(wrap(["sh", "-c", loop + "; exit 1"]), timeout=grace + 30) == 0:
        return f"{host}: leftovers stopped"
    _run(wrap(["pkill", "-KILL", "-f", pattern]))
    return f"{host}: leftovers killed"


def _sweep_slurm(name: str, host: str, grace: float) -> str:
    """Steps named guirl-NAME: inside an allocation (SLURM_JOB_ID) the launcher's steps of that job, else
    the jobs of that name."""
    job = os.environ.get("SLURM_JOB_ID", "")

    def left() -> list[str]:
        if job:
            rows = [r.split() for r in _out(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"]).splitlines()]
            return [r[0] for r in rows if r[1:] == [job_name(name)]]
        return _out(["squeue", "-h", f"--name={job_name(name)}", "-o", "%i"]).split()

    def cancel(*flags: str) -> None:
        _run(["scancel", *flags, *left()] if job else ["scancel", *flags, f"--name={job_name(name)}"])

    if not left():
        return ""
    cancel()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and left():
        time.sleep(0.5)  # waiting on slurmctld's view: nothing to block on
    if left():
        cancel("--signal=KILL")
        return f"{host}: Slurm steps killed"
    return f"{host}: Slurm steps cancelled"


def _out(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _run(argv: list[str], timeout: float = 60.0) -> int:
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout).returncode
    except (OSError, subprocess.TimeoutExpired):
        return -1


if __name__ == "__main__":
    sys.exit(main())
