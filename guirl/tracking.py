"""Weights & Biases tracking of a run: online, offline (files under ``<run_dir>/wandb``) or a no-op.

``Tracker.open`` resolves ``wandb.mode`` (``auto`` = online when a key is found as W&B finds one:
``WANDB_API_KEY``, ``wandb login``'s netrc, or guirl's ``WANDB_KEY``; else disabled) and
starts one W&B run for one job (``train``, ``eval``). Tracking never decides a result, so once a run
is up a W&B failure only costs the charts: ``log``, ``summary`` and ``close`` catch it, warn once and
stop logging, and training goes on. Starting is different: a mode that cannot work as configured (no
key online, wandb not installed, the server refusing the run) raises ``TrackingError`` before any
compute is spent.

What wandb is told, and why (checked against wandb 0.31):

- The API key goes only into the init settings (never ``wandb.login``, which writes ``~/.netrc``,
  never the run's config, never the environment). System metadata is off because wandb records
  ``sys.argv`` in it, and ``guirl train --set wandb.key=...`` would put the key in the run files.
- wandb reads its ``WANDB_*`` variables itself when it sets up, and its process-wide settings (not
  ``wandb.init``'s) decide some things: ``WANDB_MODE=auto`` makes it fail, and unless that mode is
  offline or ``WANDB_ERROR_REPORTING`` is false it posts its own usage telemetry to the W&B server at
  exit, even for an offline run. So while runs are open ``WANDB_MODE`` holds the first one's resolved
  mode, ``WANDB_SILENT`` is true and, offline, ``WANDB_ERROR_REPORTING`` defaults to false; closing
  the last one restores them and stops wandb's service process.
- Console capture, git and code saving are off: guirl's own logs and run directory hold those.
"""

import logging
import netrc
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import urlparse

from guirl.config.schema import REDACTED, SECRET_KEYS, WandbConfig
from guirl.errors import InputError

log = logging.getLogger(__name__)

Mode = Literal["online", "offline", "disabled"]


class _WandbProcess:
    """What wandb keeps per process: its service and the environment it set up from.

    wandb's service (the wandb-core process ``wandb.init`` spawns) and the settings it reads from the
    environment are process-wide, so the first tracker to open sets them up and the last to close
    tears them down. Process-global state, then, but only mirroring wandb's own.
    """

    open_runs = 0
    saved_env: dict[str, str | None] = {}

    @classmethod
    def acquire(cls, mode: Mode) -> None:
        """Count one more open run; the first one points wandb's environment variables at ``mode``."""
        cls.open_runs += 1
        if cls.open_runs > 1:
            return
        env = {"WANDB_MODE": mode, "WANDB_SILENT": "true"}
        if mode == "offline" and "WANDB_ERROR_REPORTING" not in os.environ:
            env["WANDB_ERROR_REPORTING"] = "false"
        for name, value in env.items():
            cls.saved_env[name] = os.environ.get(name)
            os.environ[name] = value

    @classmethod
    def release(cls, wandb: Any) -> None:
        """Count one run less; the last one stops wandb's service and restores the environment."""
        cls.open_runs -= 1
        if cls.open_runs > 0:
            return
        try:
            # stops the wandb-core process (it would otherwise live as long as this process) and resets
            # wandb's process-wide state, so a later open reads the environment afresh
            wandb.teardown()
        except Exception as exc:  # a dead service cannot be torn down cleanly; it is gone anyway
            log.debug("wandb teardown: %s: %s", type(exc).__name__, exc)
        for name, value in cls.saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        cls.saved_env = {}


class TrackingError(InputError):
    """W&B tracking cannot start as configured; the message says what to set or install."""


W_AND_B_MODES: dict[str, Mode] = {
    "online": "online",
    "run": "online",
    "offline": "offline",
    "dryrun": "offline",
}
"""W&B's own `WANDB_MODE` values (`run` and `dryrun` are its older names) and the mode each means."""


def find_key(cfg: WandbConfig) -> tuple[str, str]:
    """The W&B API key a run uses and where it was found, as W&B's own tools find it: `wandb.key` (from
    guirl's `WANDB_KEY` or `--set`), then W&B's `WANDB_API_KEY`, then the netrc file `wandb login` writes
    (`NETRC`, else `~/.netrc`) for the host of `WANDB_BASE_URL`; ("", "") when there is none."""
    if cfg.key:
        return cfg.key, "wandb.key"
    if os.environ.get("WANDB_API_KEY"):
        return os.environ["WANDB_API_KEY"], "WANDB_API_KEY"
    # keyed as `wandb login` keys it: the base URL's host[:port]
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        entry = None
    if entry and entry[2]:
        return entry[2], f"{path} (`wandb login`)"
    return "", ""


def resolve_mode(cfg: WandbConfig) -> Mode:
    """The mode a run uses: ``auto`` is online when a key is found (`find_key`) and disabled otherwise;
    W&B's own values as W&B means them; online needs a key."""
    if cfg.mode == "disabled":
        return "disabled"
    key = find_key(cfg)[0]
    if cfg.mode == "auto":
        return "online" if key else "disabled"
    mode = W_AND_B_MODES[cfg.mode]
    if mode == "online" and not key:
        raise TrackingError(
            f"wandb.mode is {cfg.mode!r} but no W&B API key was found: run `wandb login`, or set "
            "WANDB_API_KEY (or guirl's WANDB_KEY); or set WANDB_MODE=offline to write the run under "
            "<run_dir>/wandb without a key"
        )
    return mode


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, int | float]:
    """The numeric leaves of ``metrics``, nested keys joined with '/'; bools become 0/1, others are dropped.

    Numbers are anything ``numbers.Real`` (so numpy scalars too), returned as plain ``int``/``float``;
    strings, lists, ``None`` and other objects are skipped.
    """
    flat: dict[str, int | float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, f"{name}/"))
        elif isinstance(value, numbers.Integral):  # bool included
            flat[name] = int(value)
        elif isinstance(value, numbers.Real):
            flat[name] = float(value)
    return flat


def redact_config(config: Mapping[str, Any], *, secrets: tuple[str, ...] = ()) -> dict[str, Any]:
    """A copy of a config tree (``msgspec.to_builtins`` of a ``GuirlConfig``) safe to send to W&B.

    Every set value at a dotted path in ``SECRET_KEYS`` becomes ``"***"``, and each (non-empty) string
    of ``secrets`` is replaced by ``"***"`` wherever it appears in a string value.
    """

    def copy(value: Any, path: str) -> Any:
        if isinstance(value, Mapping):
            return {str(k): copy(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [copy(v, path) for v in value]
        if value and path in SECRET_KEYS:
            return REDACTED
        if isinstance(value, str):
            for secret in filter(None, secrets):
                value = value.replace(secret, REDACTED)
        return value

    return copy(config, "")


class Tracker:
    """One W&B run of one job, or a no-op: ``log`` numeric metrics per step, ``summary``, ``close``.

    ``Tracker()`` is the disabled tracker; ``Tracker.open`` is the way to get a live one. Use it as a
    context manager, or call ``close`` (idempotent) at the end. Several may be open at once (each is
    its own W&B run). Not thread-safe: open, log and close from one thread.
    """

    def __init__(self) -> None:
        """A disabled tracker: every method is a no-op and wandb is never imported."""
        self._run: Any = None
        self._wandb: Any = None
        self._mode: Mode = "disabled"
        self._failed = False

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, cfg: WandbConfig, *, run_dir: Path, config: Mapping[str, Any], job: str) -> "Tracker":
        """Start the W&B run for ``job`` in ``run_dir`` as ``cfg`` says (a no-op tracker when disabled).

        ``config`` is the run's resolved config tree (e.g. ``msgspec.to_builtins(cfg)``); it is sent with
        its secrets redacted. Raises ``TrackingError`` when the mode needs a key that is not set, when
        wandb is not installed, or when wandb cannot start the run.
        """
        mode = resolve_mode(cfg)
        if mode == "disabled":
            return cls()
        try:
            return cls._open(cfg, mode, run_dir=run_dir, config=config, job=job)
        except TrackingError as exc:
            if cfg.mode != "auto" or cfg.key:  # asked for, or guirl's own key given: fail loudly
                raise
            # `auto` went online only because W&B's own credentials were found: their being unusable here
            # (no wandb, no server) costs the charts, not the run
            log.warning("W&B: %s; logging to W&B is off for this run (set wandb.mode to insist)", exc)
            return cls()

    @classmethod
    def _open(
        cls, cfg: WandbConfig, mode: Mode, *, run_dir: Path, config: Mapping[str, Any], job: str
    ) -> "Tracker":
        tracker = cls()
        key = find_key(cfg)[0]
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            # wandb would quietly fall back to a temporary directory
            raise TrackingError(f"W&B run directory {str(run_dir)!r} does not exist")
        try:
            import wandb
        except ImportError as exc:
            raise TrackingError(
                f"wandb.mode is {mode!r} but wandb is not installed: pip install 'guirl[wandb]' "
                "(or set WANDB_MODE=disabled)"
            ) from exc
        try:
            settings = wandb.Settings(
                silent=True,
                console="off",
                disable_git=True,
                disable_code=True,
                save_code=False,
                x_disable_meta=True,  # the metadata holds sys.argv, which may hold `--set wandb.key=...`
                api_key=key if mode == "online" else None,
            )
        except Exception as exc:  # an older wandb without these settings
            raise TrackingError(
                f"wandb {getattr(wandb, '__version__', '?')} is too old for guirl: "
                f"pip install 'guirl[wandb]' ({type(exc).__name__}: {exc})"
            ) from None
        tracker._mode, tracker._wandb = mode, wandb
        _WandbProcess.acquire(mode)
        try:
            tracker._run = wandb.init(
                mode=mode,
                dir=str(run_dir),
                project=cfg.project or None,
                entity=cfg.entity or None,
                name=cfg.name or run_dir.name,
                tags=list(cfg.tags),
                job_type=job,
                config=redact_config(config, secrets=(key,)),
                settings=settings,
                reinit="create_new",  # a second tracker in this process is a run of its own
            )
        except Exception as exc:
            _WandbProcess.release(wandb)
            raise TrackingError(
                f"W&B could not start the {mode} run for {job!r} in {str(run_dir)!r} (set WANDB_MODE=offline "
                f"to log without the server, or disabled to turn W&B off): {type(exc).__name__}: {exc}"
            ) from None
        if mode == "offline":
            log.info("W&B offline run in %s (upload it later with `wandb sync`)", tracker.run_path)
        else:
            log.info("W&B run %s", getattr(tracker._run, "url", ""))
        return tracker

    # ------------------------------------------------------------------ using

    @property
    def mode(self) -> Mode:
        """The resolved mode this tracker was opened in."""
        return self._mode

    @property
    def enabled(self) -> bool:
        """Whether calls still reach W&B (false when disabled, closed, or after a W&B failure)."""
        return self._run is not None and not self._failed

    @property
    def run_path(self) -> Path | None:
        """This W&B run's directory, ``<run_dir>/wandb/[offline-]run-<time>-<id>``; None when not open."""
        run_files = getattr(self._run, "dir", None)
        return Path(run_files).parent if run_files else None

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log the numeric leaves of ``metrics`` (see ``flatten_metrics``) at ``step``; never raises."""
        if not self.enabled:
            return
        flat = flatten_metrics(metrics)
        if not flat:
            return
        try:
            self._run.log(flat, step=step)
        except Exception as exc:
            self._fail("log", exc)

    def summary(self, values: Mapping[str, Any]) -> None:
        """Add the numeric leaves of ``values`` to the run's summary (its final numbers); never raises."""
        if not self.enabled:
            return
        flat = flatten_metrics(values)
        if not flat:
            return
        try:
            self._run.summary.update(flat)
        except Exception as exc:
            self._fail("summary", exc)

    def _fail(self, what: str, exc: Exception) -> None:
        self._failed = True
        log.warning(
            "W&B %s failed (%s: %s); W&B logging is off for the rest of this run",
            what,
            type(exc).__name__,
            exc,
        )

    # ------------------------------------------------------------------ closing

    def close(self, *, exit_code: int = 0) -> None:
        """Finish the W&B run (``exit_code`` != 0 marks it failed); never raises.

        Closing the last open tracker of the process also stops wandb's service process.
        """
        run, self._run = self._run, None
        if run is None:
            return
        try:
            run.finish(exit_code=exit_code)
        except Exception as exc:
            if not self._failed:
                self._fail("finish", exc)
        _WandbProcess.release(self._wandb)

    def __enter__(self) -> Self:
        """Return the tracker itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the tracker; a run left by an exception is marked failed."""
        self.close(exit_code=0 if exc_type is None else 1)
