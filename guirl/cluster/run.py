"""A run's cluster: which host each actor starts on, through which launcher, and the live controls.

`guirl eval` and `guirl train` always run on a `ClusterRun`: on one machine it is the generated one-host
cluster (`ClusterRun.local`), from `bin/launch_cluster` the cluster file's. The coordinator runs in the
launching process, so its host must be a `local` one; every other role starts through its host's
launcher (`guirl.cluster.launch`), and env workers can be added and removed while the run goes on
through a control socket (`bin/launch_cluster CLUSTER.toml --add env_worker=N --host H`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import msgspec

from guirl.cluster.launch import make_launcher
from guirl.cluster.spec import ClusterFile, ClusterFileError, FollowerHost, single_host
from guirl.config import GuirlConfig

log = logging.getLogger(__name__)
MAX_CONTROL_LINE = 4096


def state_dir() -> Path:
    """Where a running cluster's launcher leaves its control socket and pid (`GUIRL_STATE_DIR`)."""
    base = os.environ.get("GUIRL_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "guirl"
    )
    return Path(base)


def control_path(name: str) -> Path:
    return state_dir() / f"{name}.sock"


def state_path(name: str) -> Path:
    return state_dir() / f"{name}.json"


class ClusterRun:
    """The hosts, launchers and role placement of one run."""

    def __init__(self, spec: ClusterFile, *, base_dir: Path | None = None, control: bool = False) -> None:
        self.spec = spec
        self.name = spec.cluster.name
        self.base_dir = base_dir or Path.cwd()
        self.control = control
        self.ports = spec.ports()
        self.launchers: dict[str, Any] = {
            h: make_launcher(h, spec.hosts[h], self.name) for h in spec.used_hosts()
        }
        r = spec.roles
        if spec.hosts[r.coordinator.host].launcher != "local":
            raise ClusterFileError(
                f"roles.coordinator.host: the coordinator runs in the launching process, so its host "
                f'({r.coordinator.host!r}) must have launcher = "local"; run bin/launch_cluster there'
            )
        self.slots: list[tuple[str, int]] = [(w.host, w.vms) for w in r.env_workers for _ in range(w.count)]
        self.next_worker = len(self.slots)
        self.status_interval_s = 10.0
        self._server: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task] = set()
        self._coord: Any = None

    @classmethod
    def local(cls, cfg: GuirlConfig) -> ClusterRun:
        """The one-host cluster of a single-machine command: the config's endpoints, workers and VMs."""
        from guirl.placement import vm_split

        vms = vm_split(cfg.env.max_envs, cfg.env.workers, cfg.env.vms_per_worker)
        spec = single_host("guirl", workers=cfg.env.workers, learner=True)
        run = cls(spec)
        run.slots = [("local", n) for n in vms]
        run.next_worker = len(vms)
        run.single = True
        return run

    single = False

    # -- placement ----------------------------------------------------------------------------------

    def host_of(self, role: str) -> str:
        r = self.spec.roles
        if role == "learner":
            return r.learner.hosts[0] if r.learner else r.coordinator.host
        got = getattr(r, role, None)
        return got.host if got is not None else r.coordinator.host

    def endpoint(self, role: str) -> str:
        host = self.host_of(role)
        key = (host, "learner" if role == "learner" else role)
        return f"tcp://{self.spec.hosts[host].address}:{self.ports.get(key, 0)}"

    def apply(self, cfg: GuirlConfig) -> GuirlConfig:
        """The run's config on this cluster: every mailbox on its host's address and port, the cluster's
        CURVE keys, its worker count and VMs. The one-host cluster leaves the config as it is."""
        if self.single:
            return cfg
        keys = self.spec.cluster.keys_dir
        if keys and not os.path.isabs(keys):
            keys = str(self.base_dir / keys)
        endpoints = msgspec.structs.replace(
            cfg.endpoints,
            coordinator=self.endpoint("coordinator"),
            broker=self.endpoint("broker"),
            prm=self.endpoint("prm") if self.spec.roles.prm else cfg.endpoints.prm,
            learner=self.endpoint("learner"),
        )
        workers = max(1, len(self.slots))
        learner = self.spec.roles.learner
        train = cfg.train
        per_host = (learner.gpus_per_host or len(learner.gpus) or None) if learner is not None else None
        if learner is not None and (per_host is not None or len(learner.hosts) > 1):
            train = msgspec.structs.replace(train, ranks=(per_host or 1) * len(learner.hosts))
        return msgspec.structs.replace(
            cfg,
            train=train,
            endpoints=endpoints,
            runtime=msgspec.structs.replace(cfg.runtime, curve_keys_dir=keys or cfg.runtime.curve_keys_dir),
            env=msgspec.structs.replace(
                cfg.env, workers=workers, vms_per_worker=0, max_envs=sum(n for _, n in self.slots) or 1
            ),
        )

    def prepare(self, cfg: GuirlConfig, mode: str) -> GuirlConfig:
        """`apply(cfg)`, checked for a run in `mode` (`guirl.config.validate`): where the cluster file names
        the roles' GPUs, their counts replace NUM_GPUS, ACTOR_GPUS..., and `plan` checks those instead."""
        from guirl.config.validate import validate

        cfg = self.apply(cfg)
        validate(cfg, mode, gpus=not self.names_gpus)
        return cfg

    # -- GPUs ---------------------------------------------------------------------------------------------

    @property
    def names_gpus(self) -> bool:
        r = self.spec.roles
        return bool(r.broker.gpus or (r.prm and r.prm.gpus) or (r.learner and r.learner.gpus))

    def broker_gpus(self) -> list[str]:
        """What the broker's process sees: its rollout engines' GPUs, then the judge's (one host)."""
        r = self.spec.roles
        return [str(g) for g in (*r.broker.gpus, *(r.prm.gpus if r.prm else []))]

    def plan(self, cfg: GuirlConfig, mode: str) -> Any:
        """The run's GPU layout. Without GPU ids in the cluster file, `guirl.placement.plan` over this
        host's CUDA_VISIBLE_DEVICES and NUM_GPUS / ACTOR_GPUS / ROLLOUT_GPUS / PRM_GPUS. With them, the same
        rules over the roles' own GPUs, each process seeing only its role's: the learner's ranks their
        `roles.learner.gpus`, the broker its engines' (rollout, then judge), so engine ordinals count from
        there and the same physical ids may recur on other hosts."""
        import dataclasses

        from guirl.placement import plan

        if self.single or not self.names_gpus:
            return plan(cfg, mode)  # type: ignore[arg-type]
        r = self.spec.roles
        train = mode == "train"
        on_gpu = train and cfg.train.device != "cpu"
        learner = [str(g) for g in (r.learner.gpus if r.learner and on_gpu else [])]
        if on_gpu and not learner:
            raise ClusterFileError(
                "roles.learner.gpus: the cluster file names the engines' GPUs, so it must name the learner's "
                '(or set train.device = "cpu")'
            )
        rollout = [str(g) for g in r.broker.gpus]
        judge = [str(g) for g in (r.prm.gpus if r.prm and train and cfg.prm.enabled else [])]
        tokens = [f"learner:{g}" for g in learner] + [f"broker:{g}" for g in rollout + judge]
        counts = msgspec.structs.replace(
            cfg.cluster,
            num_gpus=len(tokens),
            actor_gpus=len(learner),
            rollout_gpus=len(rollout),
            prm_gpus=len(judge),
        )
        one_host = msgspec.structs.replace(
            cfg, cluster=counts, train=msgspec.structs.replace(cfg.train, ranks=max(1, len(learner)))
        )
        laid = plan(one_host, mode, visible=",".join(tokens))  # type: ignore[arg-type]
        seen = self.broker_gpus()

        def per_host(engine: Any) -> Any:
            gpus = tuple(g.split(":", 1)[1] for g in engine.gpus)
            return dataclasses.replace(engine, gpus=gpus, ordinals=tuple(seen.index(g) for g in gpus))

        return dataclasses.replace(
            laid,
            learner_gpus=tuple(learner),
            learner_ordinals=tuple(range(len(learner))),
            rollout=tuple(per_host(e) for e in laid.rollout),
            judge=tuple(per_host(e) for e in laid.judge),
        )

    def place(self, spec: Any, role: str) -> Any:
        """`spec` (an ActorSpec) on its role's host, with the host's address in its environment; the
        learner also learns where its other ranks run when they span hosts."""
        host = self.host_of(role)
        learner = self.spec.roles.learner
        if role == "learner" and learner is not None and len(learner.hosts) > 1:
            per_host = learner.gpus_per_host or len(learner.gpus) or 1
            ranks: list[FollowerHost | None] = []
            for rank in range(1, per_host * len(learner.hosts)):
                name = learner.hosts[rank // per_host]
                ranks.append(
                    None
                    if name == learner.hosts[0]
                    else FollowerHost(
                        host=name, spec=self.spec.hosts[name], cluster=self.name, local_rank=rank % per_host
                    )
                )
            options = {
                **spec.options,
                "follower_hosts": msgspec.to_builtins(ranks),
                "master_port": self.ports[(learner.hosts[0], "learner.master")],
            }
            spec = msgspec.structs.replace(spec, options=options)
        if role == "broker" and self.names_gpus and not self.single and self.broker_gpus():
            spec = msgspec.structs.replace(
                spec, env={**spec.env, "CUDA_VISIBLE_DEVICES": ",".join(self.broker_gpus())}
            )
        return self.on_host(spec, host)

    def on_host(self, spec: Any, host: str) -> Any:
        from guirl.net import HOST_ADDRESS_ENV

        env = dict(spec.env)
        if not self.single:
            env[HOST_ADDRESS_ENV] = self.spec.hosts[host].address
        return msgspec.structs.replace(spec, host=host, env=env)

    # -- live scaling ---------------------------------------------------------------------------------

    async def serve(
        self, sup: Any, make_worker: Callable[[int, int], Any], out: TextIO, coord: Any = None
    ) -> None:
        """Accept `add`/`remove`/`status` requests on the control socket until `close()`."""
        self._coord = coord
        if not self.control:
            return
        path = control_path(self.name)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.exists():
            path.unlink()
        lock = asyncio.Lock()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            self._handlers.add(task)
            try:
                await answer(reader, writer)
            finally:
                self._handlers.discard(task)

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                line = await asyncio.wait_for(reader.readline(), 10.0)
                if len(line) > MAX_CONTROL_LINE:
                    raise ValueError("request too long")
                request = json.loads(line or b"null")
                async with lock:
                    reply = await self.control_request(request, sup, make_worker, out)
            except (ValueError, TypeError, KeyError, ClusterFileError, TimeoutError) as exc:
                reply = {"ok": False, "error": str(exc) or type(exc).__name__}
            except Exception as exc:  # an actor that would not start: said, and the run goes on
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            with contextlib.suppress(ConnectionError):
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
                writer.close()

        old_mask = os.umask(0o177)  # the socket is created 0600, not made so after the fact
        try:
            self._server = await asyncio.start_unix_server(handle, path=str(path), limit=MAX_CONTROL_LINE * 2)
        finally:
            os.umask(old_mask)

    async def control_request(self, request: Any, sup: Any, make_worker: Callable, out: TextIO) -> dict:
        if not isinstance(request, dict) or request.get("op") not in ("add", "remove", "status"):
            raise ValueError('expected {"op": "add"|"remove"|"status", ...}')
        if request["op"] == "status":
            counters = self._coord.counters.snapshot() if self._coord is not None else {}
            return {
                "ok": True,
                "workers": self.worker_hosts(sup),
                "actors": {
                    n: {"host": h.spec.host, "up": h.alive, "pid": h.pid, "restarts": h.restarts}
                    for n, h in sup.actors.items()
                },
                "coordinator": {
                    k: v for k, v in counters.items() if k.startswith(("security.", "episodes.", "groups."))
                },
            }
        host = request.get("host")
        count = request.get("count")
        if host not in self.spec.hosts:
            raise ValueError(
                f"host {host!r} is not in the cluster file (known: {', '.join(self.spec.hosts)})"
            )
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 256:
            raise ValueError(f"count {count!r}: expected a whole number from 1 to 256")
        if request["op"] == "add":
            vms = request.get("vms") or next((n for h, n in self.slots if h == host), 1)
            if not isinstance(vms, int) or isinstance(vms, bool) or not 1 <= vms <= 256:
                raise ValueError(f"vms {vms!r}: expected a whole number from 1 to 256")
            if host not in self.launchers:
                self.launchers[host] = make_launcher(host, self.spec.hosts[host], self.name)
                sup.launchers[host] = self.launchers[host]
            names = []
            for _ in range(count):
                index = self.next_worker
                self.next_worker += 1
                spec = self.on_host(make_worker(index, vms), host)
                await sup.start(spec)
                names.append(spec.name)
                out.write(f"[cluster] added {spec.name} on {host} ({vms} VMs)\n")
            return {"ok": True, "added": names}
        on_host = [n for n, h in self.worker_hosts(sup).items() if h == host]
        if len(on_host) < count:
            raise ValueError(f"host {host!r} runs {len(on_host)} env worker(s), not {count}")
        names = sorted(on_host, key=lambda n: int(n.removeprefix("worker") or 0))[-count:]
        await asyncio.gather(*(sup.stop(n) for n in names))
        for n in names:
            out.write(f"[cluster] removed {n} from {host} (its running episodes are handed out again)\n")
        return {"ok": True, "removed": names}

    @staticmethod
    def worker_hosts(sup: Any) -> dict[str, str]:
        return {n: h.spec.host for n, h in sup.actors.items() if n.startswith("worker")}

    async def close(self) -> None:
        """Stop taking requests, and end those being answered (before the run's actors are stopped, so that
        an `add` cannot start a worker nobody will stop)."""
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
            with contextlib.suppress(OSError):
                control_path(self.name).unlink()

    # -- live status ------------------------------------------------------------------------------------

    def status(self, sup: Any, coord: Any) -> str:
        """One line per actor (host, up/down, pid, restarts, heartbeat age, episodes in flight) and one
        per host (load)."""
        heard = coord.heard_ages()
        running: dict[str, int] = {}
        for run in coord.running.values():
            running[run.worker] = running.get(run.worker, 0) + 1
        head = ("actor", "host", "state", "pid", "restarts", "heartbeat", "queue")
        lines = ["{:<12} {:<10} {:<6} {:>7} {:>8} {:>9} {:>5}".format(*head)]
        for name, handle in sorted(sup.actors.items()):
            age = heard.get(name)
            lines.append(
                f"{name:<12} {handle.spec.host or '-':<10} {'up' if handle.alive else 'down':<6} "
                f"{handle.pid:>7} {handle.restarts:>8} {f'{age:.1f} s' if age is not None else '-':>9} "
                f"{running.get(name, 0):>5}"
            )
        loads = {h: getattr(self.launchers.get(h), "load", None) for h in self.spec.used_hosts()}
        for handle in sup.actors.values():
            reported = getattr(handle.process, "load", None)
            if reported is not None:
                loads[handle.spec.host] = reported
        loads[self.spec.roles.coordinator.host] = os.getloadavg()[0]
        lines.append(
            "hosts: "
            + ", ".join(f"{h} load {v:.2f}" if v is not None else f"{h} load -" for h, v in loads.items())
        )
        return "\n".join(lines)


class StatusPrinter:
    """Prints the cluster's status every `interval` seconds (never on the one-host cluster)."""

    def __init__(self, cluster: ClusterRun, interval: float, out: TextIO, writer: Any = None) -> None:
        """`writer`: the run's `guirl.status.StatusWriter` (its `status.json`, on any cluster)."""
        self.cluster, self.interval, self.out, self.writer = cluster, interval, out, writer
        self.last = time.monotonic()

    def maybe(self, sup: Any, coord: Any) -> None:
        if self.writer is not None:
            self.writer.maybe(sup)
        if self.cluster.single or self.interval <= 0 or time.monotonic() - self.last < self.interval:
            return
        self.last = time.monotonic()
        self.out.write(f"[cluster] {self.cluster.name} status\n{self.cluster.status(sup, coord)}\n")
        self.out.flush()
