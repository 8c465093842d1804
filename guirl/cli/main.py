"""The `guirl` command.

    guirl eval --config FILE    evaluation-only mode: every task of an eval set, accuracy per domain
                                (--resume RUN finishes an interrupted one)
    guirl train --config FILE   RL mode (GRPO, decoupled): env workers act while the learner trains
    guirl demo                  the transport demo (actors, sockets, a broker killed and restarted)
    guirl replay ...            read, filter, export and re-send message logs (also `bin/replay`)
    guirl config show           the resolved configuration as TOML (`--describe`: every setting documented)
    guirl actor run TARGET      run one actor in the foreground (module:Class), e.g. as a replay target
    guirl tasks check PATH...   validate task files; per domain, how many guirl fully supports
    guirl tasks generate targets --out DIR   a suite of the targets family a small model can learn
    guirl learn                 learning on local desktops: a suite, a warm start, GRPO, the held-out curve
    guirl vm shot|run ...       a local VM: a screenshot, or a task set up, acted on and evaluated
    guirl model tiny OUTDIR     write a tiny random Qwen3-VL checkpoint (tests, demos; built offline)
    guirl prm score RUN_DIR     judge every step of a finished run's episodes (study a judge, no training)
    guirl data synth|check ...  GUI grounding rows: synthesize (PIL screens), or check a .jsonl/.parquet file
    guirl keys init DIR         CURVE keys securing a cluster's sockets (then runtime.curve_keys_dir=DIR)
    guirl sft --config FILE     supervised fine-tuning on grounding rows (GUI-R1 answers), the learner's code
    guirl runs [DIR]            the runs under DIR (default run.root_dir): mode, start, state, figures
    guirl runs show RUN         a run's summary and tables, printed again
    guirl --version

Configuration: `--config FILE.toml`, then OpenClaw-RL's GUI-RL environment variables, then `--set key=value`.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import re
import sys
from typing import Any

from guirl import __version__


class HelpFormatter(argparse.HelpFormatter):
    """Every option's default in its help, unless it has none worth showing or the help says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        quiet = action.default in (None, False, [], argparse.SUPPRESS) or "default" in text
        if not action.option_strings or quiet:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """guirl's parsers (every subcommand's too): defaults in the help, a suggestion for a mistyped command
    or flag, and a mistyped flag answered with that subcommand's usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        # Python quotes the choices in this message, or (3.12.8+) not: read both
        m = re.search(r"invalid choice: '?([^' ]*)'? \(choose from (.*)\)$", message)
        if m:
            choices = [c.strip().strip("'") for c in m.group(2).split(",")]
            close = difflib.get_close_matches(m.group(1), choices, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        super().error(message)

    def unrecognized(self, extras: list[str]) -> None:
        """Exit 2 with this parser's usage, naming each argument it does not take (and the closest flag)."""
        options = [o for a in self._actions for o in a.option_strings]
        said = []
        for extra in extras:
            close = difflib.get_close_matches(extra.split("=")[0], options, n=1) if extra[:1] == "-" else []
            said.append(f"{extra} (did you mean {close[0]}?)" if close else extra)
        self.error(f"unrecognized arguments: {' '.join(said)}")

    def subcommands(self) -> list[argparse._SubParsersAction]:
        return [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]


def _mark(parser: Parser) -> None:
    """Let every parser below `parser` be found from the parsed arguments (`_parser`: the deepest reached),
    and a group of subcommands be given alone (it prints its help)."""
    parser.set_defaults(_parser=parser)
    for n, action in enumerate(parser.subcommands()):
        action.required = False
        if action.dest is argparse.SUPPRESS:
            action.dest = f"_subcommand_{n}"
        for child in set(action.choices.values()):
            _mark(child)


@functools.cache
def _defaults() -> dict[str, Any]:
    from guirl.config import describe

    return {f.path: f.default for f in describe()}


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else json.dumps(value)


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="TOML config file")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one setting, e.g. --set runtime.heartbeat_interval_s=0.5 (repeatable)",
    )


def _skip_unsupported_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--skip-unsupported",
        action="store_true",
        help="leave out, listed as skipped, tasks guirl cannot set up or score (default: refuse the suite)",
    )


def _dry_run_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the configuration and print the GPU plan (learner, engines, workers); start nothing",
    )


FLAG_HELP = {
    "tasks": "meta list of tasks ({domain: [ids]})",
    "limit": "only the first N tasks (0: all)",
    "workers": "env worker processes",
    "vms_per_worker": "VMs (episodes at once) per env worker (0: env.max_envs shared out)",
    "backend": "inference backend",
    "ckpt": "policy checkpoint: a directory, a Hugging Face id in the local cache, or 'tiny'",
    "max_steps": "steps before an episode is truncated",
    "updates": "policy updates to make",
}


def _run_args(p: argparse.ArgumentParser, mode: str) -> None:
    """The flags `guirl eval` and `guirl train` share: config, task selection, workers, backend, model."""
    _config_args(p)
    defaults = _defaults()
    for flag, key in run_flags(mode).items():
        kind: dict[str, Any] = {"type": int} if isinstance(defaults[key], int) else {}
        if flag == "backend":
            kind = {"choices": ["hf", "openai", "scripted", "sglang"]}
        text = f"{FLAG_HELP[flag]} [{key}; default {_shown(defaults[key])}]".replace("%", "%%")
        p.add_argument(f"--{flag.replace('_', '-')}", help=text, **kind)
    p.add_argument(
        "--domain",
        action="append",
        default=[],
        help=f"only this domain of the task list (repeatable) [{mode}.domains; default: all]",
    )
    _skip_unsupported_arg(p)
    _dry_run_arg(p)


def _load(args: argparse.Namespace, mode: str | None = None):
    """The config of `--config`, the environment and `--set`, checked (`guirl.config.validate`) for `mode`."""
    from guirl.config import load_config
    from guirl.errors import InputError

    cfg = load_config(args.config, overrides=args.set, mode=mode)
    if mode is not None and _ignored_flags(args, cfg, mode):
        raise InputError(_ignored_flags(args, cfg, mode)[0])
    return cfg


def _ignored_flags(args: argparse.Namespace, cfg: Any, mode: str) -> list[str]:
    """The run flags a run of `cfg` would not use (`guirl.config.validate.check_rows` has the keys'
    rules): `--tasks` in GUI-R1 mode, which plays the rows of `data.<mode>`."""
    rows = cfg.data.eval if mode == "eval" else cfg.data.train
    if rows and getattr(args, "tasks", None):
        return [
            f"--tasks names an OSWorld task list, but this {mode} plays the rows of data.{mode} ({rows}); "
            f"give the rows instead (--set data.{mode}=FILE)"
        ]
    return []


def _dry_run(args: argparse.Namespace, mode: str, resume: Any = None) -> int:
    """Check everything a run of `mode` would check before starting (the config's rules, the GPU plan,
    the task lists and their domains, the checkpoints, the run to resume), say every problem at once, and
    print the plan when there is none; nothing starts (no run directory, no process, no torch)."""
    from guirl import roles
    from guirl.config.validate import problems
    from guirl.errors import InputError
    from guirl.model.checkpoints import TINY, resolve_checkpoint, resolve_prm_checkpoint
    from guirl.placement import plan

    cfg = _load(args)  # typed; the rules between fields are the first of the checks below
    found = problems(cfg, mode) + _ignored_flags(args, cfg, mode)
    checks = [lambda: roles.suite(cfg, mode)]  # type: ignore[arg-type]
    if mode == "train" and cfg.train.eval_every:
        checks.append(lambda: roles.suite(cfg, "eval", in_training=True))
    if cfg.model.hf_ckpt != TINY:  # "tiny" is built on first use, so it is taken as given here
        checks.append(lambda: resolve_checkpoint(cfg))
    if mode == "train" and cfg.prm.enabled and cfg.model.prm_model_path != TINY:
        checks.append(lambda: resolve_prm_checkpoint(cfg))
    if resume is not None:  # the run to resume, taken with this configuration
        checks.append(lambda: resume(cfg))
    placement = None
    if not found:  # the GPU plan needs the rules to hold
        try:
            placement = plan(cfg, mode)  # type: ignore[arg-type]
        except InputError as exc:
            found.append(str(exc))
    for check in checks:
        try:
            check()
        except InputError as exc:
            found.append(str(exc))
    if found:
        print(f"guirl {mode} --dry-run: {len(found)} problem(s); nothing was started", file=sys.stderr)
        for problem in found:
            print(f"  - {problem}", file=sys.stderr)
        return 2
    print(placement.describe(cfg))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import uvloop

    from guirl.demo import run_demo
    from guirl.log import setup_logging

    cfg = _load(args)
    setup_logging("demo", level=cfg.logging.level, fmt=cfg.logging.format)
    summary = uvloop.run(run_demo(cfg))
    eps = summary["episodes"]
    print(f"[demo] {sum(eps.values())} episodes ({eps}), {summary['steps']} steps in {summary['seconds']} s")
    print(
        f"[demo] recorded {sum(summary['recorded_messages'].values())} messages; "
        f"{summary['distinct_screenshots_stored']} distinct screenshots stored"
    )
    print(f"[demo] supervisor: {', '.join(summary['supervisor_events'])}")
    for ep in summary.get("desktops", {}).get("episodes", []):
        print(
            f"[demo] local VM {ep['vm']}: task {ep['task']} scored {ep['score']} in {ep['steps']} steps "
            f"({ep['seconds']} s)"
        )
    print(f"[demo] run directory: {summary['run_dir']}")
    print(f"[demo] try: bin/replay list {summary['run_dir']}/msglogs --type echo --actor broker")
    return 0


def run_flags(mode: str) -> dict[str, str]:
    """The flags of `guirl eval` and `guirl train` that set a config key (flag dest -> key): named alike
    in both, each mode's task selection its own."""
    return {
        "tasks": f"{mode}.tasks",
        "limit": f"{mode}.limit",
        "workers": "env.workers",
        "vms_per_worker": "env.vms_per_worker",
        "backend": "inference.backend",
        "ckpt": "model.hf_ckpt",
        "max_steps": "agent.max_steps",
        **({"updates": "train.updates"} if mode == "train" else {}),
    }


def _settings(args: argparse.Namespace, mode: str) -> None:
    """The run flags given, as `--set` overrides (flags win over the file and the environment)."""
    for flag, key in run_flags(mode).items():
        value = getattr(args, flag)
        if value is not None:
            args.set.append(f"{key}={value}")
    if args.domain:
        args.set.append(f"{mode}.domains={json.dumps(args.domain)}")
    if args.skip_unsupported:  # a training run's tasks and its periodic evaluation's
        modes = ("train", "eval") if mode == "train" else ("eval",)
        args.set += [f"{m}.skip_unsupported=true" for m in modes]


def _resume_dir(args: argparse.Namespace) -> Any:
    """The run `--resume` names (None without it); its own resolved configuration unless `--config` is
    given (its secrets come from the environment)."""
    if not args.resume:
        return None
    from pathlib import Path

    from guirl.errors import InputError

    run_dir = Path(args.resume)
    if not (run_dir / "config.toml").is_file():
        raise InputError(f"--resume {args.resume}: not a run directory (no config.toml in it)")
    if args.config is None:
        args.config = str(run_dir / "config.toml")
    return run_dir


def cmd_eval(args: argparse.Namespace) -> int:
    import uvloop

    from guirl.errors import RunError
    from guirl.eval import earlier_sessions, run_eval
    from guirl.log import setup_logging

    _settings(args, "eval")
    run_dir = _resume_dir(args)
    if args.dry_run:
        return _dry_run(args, "eval", (lambda cfg: earlier_sessions(cfg, run_dir)) if run_dir else None)
    cfg = _load(args, "eval")
    setup_logging("eval", level=cfg.logging.level, fmt=cfg.logging.format)
    try:
        summary = uvloop.run(run_eval(cfg, run_dir, resume=run_dir is not None))
    except RunError as exc:
        print(f"guirl eval: {exc}", file=sys.stderr)
        return 1
    if not any(r["status"] == "completed" for r in summary["results"]):
        print(
            "guirl eval: no task could be scored (environment errors only); see summary.json", file=sys.stderr
        )
        return 1
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import uvloop

    from guirl.errors import RunError
    from guirl.log import setup_logging
    from guirl.train import resume_point, run_train

    _settings(args, "train")
    if args.sync:
        args.set.append("train.sync=true")
    run_dir = _resume_dir(args)
    if args.dry_run:
        return _dry_run(args, "train", (lambda cfg: resume_point(run_dir)) if run_dir else None)
    cfg = _load(args, "train")
    setup_logging("train", level=cfg.logging.level, fmt=cfg.logging.format)
    try:
        summary = uvloop.run(run_train(cfg, run_dir, resume=run_dir is not None))
    except RunError as exc:
        print(f"guirl train: {exc}", file=sys.stderr)
        return 1
    return 0 if summary["updates"] else 1


def cmd_sft(args: argparse.Namespace) -> int:
    from guirl.log import setup_logging
    from guirl.sft import run_sft

    for flag, path in {"data": "sft.data", "epochs": "sft.epochs", "ckpt": "model.hf_ckpt"}.items():
        value = getattr(args, flag)
        if value is not None:
            args.set.append(f"{path}={value}")
    cfg = _load(args)
    setup_logging("sft", level=cfg.logging.level, fmt=cfg.logging.format)
    summary = run_sft(cfg)
    return 0 if summary["steps"] else 1


def cmd_learn(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from guirl.errors import InputError
    from guirl.learn import LearnPlan, run_learn
    from guirl.log import setup_logging
    from guirl.vmpool.targets import parse_goals

    config = args.config or str(Path(__file__).resolve().parents[2] / "configs" / "desktop_learning.toml")
    if not Path(config).is_file():
        raise InputError(f"guirl learn: no config at {config}; pass --config (configs/desktop_learning.toml)")
    plan = LearnPlan(
        config=config,
        overrides=args.set,
        train_tasks=args.train_tasks,
        test_tasks=args.test_tasks,
        kinds=tuple(k for k in args.kinds.split(",") if k),
        seed=args.seed,
        goals=parse_goals(args.goals),
        control=args.control,
    )
    setup_logging("learn", level="WARNING")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no bar for writing the policy's shards
    run_learn(plan)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from guirl.config import describe, to_toml

    if args.describe:
        for f in describe():
            env = f" [env {f.env}]" if f.env else ""
            print(f"{f.path} ({f.type}, default {json.dumps(f.default)}){env}: {f.doc}")
        return 0
    print(to_toml(_load(args)), end="")
    return 0


def cmd_actor(args: argparse.Namespace) -> int:
    import msgspec

    from guirl.errors import InputError
    from guirl.log import setup_logging
    from guirl.runtime.process import ActorSpec, build_actor, check_options, run_actor

    cfg = _load(args)
    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"guirl actor run: --option needs KEY=VALUE, got {item!r}")
        try:  # a table or a list is JSON; anything else is converted to the option's type below
            options[key] = json.loads(value) if value[:1] in ("{", "[") else value
        except ValueError as exc:
            raise InputError(f"guirl actor run: --option {key}: not JSON ({exc})") from None
    spec = ActorSpec(
        name=args.name,
        target=args.target,
        bind=args.bind,
        options=options,
        record=args.record,
        run_dir=args.run_dir,
    )
    typed = check_options(spec, strict=False)  # "3" for a number, "true" for a flag; bad: exit 2 here
    if typed is not None:
        spec = msgspec.structs.replace(spec, options=msgspec.to_builtins(typed))
    setup_logging(spec.name, level=cfg.logging.level, fmt=cfg.logging.format)
    actor = build_actor(spec, cfg)

    def ready(endpoints: list[str]) -> None:
        print(json.dumps({"ready": spec.name, "endpoints": endpoints}), flush=True)

    run_actor(actor, ready)
    return 0


def cmd_tasks_check(args: argparse.Namespace) -> int:
    from pathlib import Path

    from guirl.vmpool.tasks.check import check, render

    report = check([Path(p) for p in args.paths])
    if report.domains:
        print(render(report))
    elif report.errors:  # nothing could be read: the errors alone, not an empty table
        for error in report.errors:
            print(f"guirl tasks check: {error}", file=sys.stderr)
    return 1 if report.errors else 0


def cmd_tasks_generate(args: argparse.Namespace) -> int:
    from guirl.errors import InputError
    from guirl.vmpool.targets import parse_goals
    from guirl.vmpool.tasks.generate import GenerateSpec, generate

    spec = GenerateSpec(
        out=args.out,
        train=args.train,
        test=args.test,
        kinds=[k for k in args.kinds.split(",") if k],
        width=args.width,
        height=args.height,
        seed=args.seed,
        hard_labels=args.hard_labels,
        goals=None if (goals := parse_goals(args.goals)) is None else list(goals),
    )
    try:
        info = generate(spec)
    except (ValueError, OSError) as exc:
        raise InputError(f"guirl tasks generate: {exc}") from exc
    splits = ", ".join(f"{n} {k.removesuffix('.json')}" for k, n in info["tasks"].items())
    print(
        f"[tasks] {args.out}: targets tasks ({', '.join(spec.kinds)}) for {spec.width}x{spec.height} "
        f"screens: {splits}"
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from guirl.errors import InputError
    from guirl.status import read_status, render

    try:
        doc = read_status(args.run_dir)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    print(json.dumps(doc, indent=1) if args.json else render(doc), end="\n" if args.json else "")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from pathlib import Path

    from guirl.errors import InputError
    from guirl.runs import list_runs, render_list, show

    words = list(args.words)
    if words[:1] == ["show"]:
        if len(words) != 2:
            raise InputError("guirl runs show: give one run directory (guirl runs show RUN)")
        print(show(Path(words[1])))
        return 0
    if len(words) > 1:
        raise InputError(f"guirl runs: one directory at most, got {' '.join(words)}")
    root = Path(words[0]) if words else Path(_load(args).run.root_dir)
    if not words and not root.exists():  # nothing run here yet: not an error
        print(f"no runs under {root} yet")
        return 0
    print(render_list(list_runs(root)))
    return 0


def cmd_keys_init(args: argparse.Namespace) -> int:
    from guirl.runtime.security import AUTHORIZED, init_keys

    keys = init_keys(args.dir, force=args.force)
    print(f"{keys.path}: cluster key {keys.public.decode()} (authorized in {AUTHORIZED}/)")
    print(f"copy it to every host (it holds the secret key) and set runtime.curve_keys_dir={keys.path}")
    return 0


def cmd_model_tiny(args: argparse.Namespace) -> int:
    from guirl.model.tiny import count_parameters, write_tiny_checkpoint

    path = write_tiny_checkpoint(
        args.outdir, seed=args.seed, hidden=args.hidden, layers=args.layers, thinking=args.thinking
    )
    print(f"{path} ({count_parameters(path):,} parameters)")
    return 0


def cmd_prm_score(args: argparse.Namespace) -> int:
    from pathlib import Path

    import uvloop

    from guirl.log import setup_logging
    from guirl.prm_offline import score_run

    if args.limit < 0:
        raise SystemExit("guirl prm score: --limit must be >= 0")
    cfg = _load(args)  # the judge under study: this config, never the run's own
    setup_logging("prm-score", level=cfg.logging.level, fmt=cfg.logging.format)
    summary = uvloop.run(
        score_run(cfg, Path(args.run_dir), limit=args.limit, overwrite=args.overwrite, out_name=args.out)
    )
    if not summary["steps_judged"]:
        print("guirl prm score: no step could be judged; see the warnings above", file=sys.stderr)
        return 1
    if summary["judge_errors"] == summary["steps_judged"]:
        print("guirl prm score: the judge could not be asked for any step; see the log", file=sys.stderr)
        return 1
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    import signal
    from pathlib import Path

    from guirl.errors import InputError
    from guirl.view import build
    from guirl.view.serve import Server

    root = Path(args.run_dir)
    if not root.is_dir():
        raise InputError(f"guirl view: {args.run_dir}: no such directory")
    if args.compare and args.versions:
        raise InputError("guirl view: --compare (another run) or --versions (two of this run's), not both")
    if not 0 <= args.port <= 65535:
        raise InputError(f"guirl view: --port {args.port}: not a port")
    if not (0.05 <= args.interval <= 3600):  # NaN fails too
        raise InputError(f"guirl view: --interval {args.interval}: give seconds between 0.05 and 3600")
    extra = {"compare": args.compare, "versions": tuple(args.versions) if args.versions else None}
    if args.compare and not Path(args.compare).is_dir():
        raise InputError(f"guirl view: --compare {args.compare}: no such directory")
    if not args.serve:
        try:
            built = build(root, **extra)
        except (FileNotFoundError, ValueError) as exc:
            raise InputError(f"guirl view: {exc}") from exc
        except OSError as exc:  # the site cannot be written (a read-only run directory)
            raise InputError(f"guirl view: cannot write the site: {exc}") from exc
        print(built.line())
        for problem in built.problems[:20]:
            print(f"[view] not shown: {problem}")
        if len(built.problems) > 20:
            print(f"[view] … and {len(built.problems) - 20} more: the run page lists them all")
        return 0
    try:
        server = Server(root, port=args.port, interval_s=args.interval, **extra)
    except OSError as exc:  # the port is taken
        raise InputError(f"guirl view: cannot serve on 127.0.0.1:{args.port}: {exc}") from exc
    try:
        server.rebuild_if_changed(sys.stdout)
    except (FileNotFoundError, ValueError, OSError) as exc:
        server.httpd.server_close()
        raise InputError(f"guirl view: {exc}") from exc
    signal.signal(signal.SIGTERM, lambda *_: server.stop.set())
    print(f"[view] serving {server.url} (rebuilt as the run writes; Ctrl-C to stop)", flush=True)
    try:
        server.run(sys.stdout)
    except KeyboardInterrupt:
        pass
    return 0


def build_parser() -> argparse.ArgumentParser:
    from guirl.cli.replay import add_arguments as replay_arguments

    parser = Parser(prog="guirl", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"guirl {__version__}")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND")
    p = sub.add_parser("eval", help="evaluation-only mode: run an eval set, report accuracy per domain")
    _run_args(p, "eval")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="finish an interrupted eval: keep the tasks it scored, run the rest, one summary",
    )
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("train", help="RL mode: GRPO with env workers acting while the learner trains")
    _run_args(p, "train")
    p.add_argument("--sync", action="store_true", help="no overlap: play a batch, then train on it")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser(
        "learn", help="learning on local desktops end to end: a task suite, a warm start, GRPO, the curve"
    )
    _config_args(p)
    p.add_argument("--train-tasks", type=int, default=128, help="generated training tasks (default 128)")
    p.add_argument("--test-tasks", type=int, default=64, help="generated held-out tasks (default 64)")
    p.add_argument("--kinds", default="click", help="task kinds of the targets family (default click)")
    p.add_argument("--seed", type=int, default=0, help="the suite's first seed (default 0)")
    p.add_argument(
        "--goals",
        default="red",
        help="colours the tasks ask for, comma-separated, or 'any' (default red: docs/desktop-learning.md)",
    )
    p.add_argument("--control", action="store_true", help="also run the shuffled-reward control")
    p.set_defaults(func=cmd_learn)
    p = sub.add_parser("data", help="single-step grounding data: synthetic rows, checking a dataset file")
    from guirl.data.cli import add_arguments as data_arguments

    data_arguments(p)
    p.set_defaults(func=lambda a: __import__("guirl.data.cli", fromlist=["main"]).main(a))
    p = sub.add_parser("sft", help="supervised fine-tuning on grounding rows (GUI-R1 answers)")
    _config_args(p)
    p.add_argument("--data", help="rows to train on (.jsonl or .parquet)")
    p.add_argument("--epochs", type=int, help="passes over the rows")
    p.add_argument("--ckpt", help="checkpoint to start from (HF_CKPT), or 'tiny'")
    p.set_defaults(func=cmd_sft)
    p = sub.add_parser("demo", help="run the transport demo")
    _config_args(p)
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("replay", help="read, filter, export and re-send message logs")
    replay_arguments(p)
    p.set_defaults(func=lambda a: __import__("guirl.cli.replay", fromlist=["run"]).run(a))
    p = sub.add_parser("config", help="show the resolved configuration")
    csub = p.add_subparsers(dest="config_cmd", required=True)
    show = csub.add_parser("show", help="the resolved configuration as TOML")
    _config_args(show)
    show.add_argument("--describe", action="store_true", help="list every setting with its documentation")
    show.set_defaults(func=cmd_config)
    p = sub.add_parser("actor", help="run one actor")
    asub = p.add_subparsers(dest="actor_cmd", required=True)
    run = asub.add_parser("run", help="run one actor in the foreground until SIGTERM/SIGINT or Shutdown")
    run.add_argument("target", help="module:Class, e.g. guirl.actors.echo:EchoActor")
    run.add_argument("--name", required=True)
    run.add_argument("--bind", action="append", default=[], help="mailbox endpoint (repeatable)")
    run.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one of the actor's options (its class's Options; a table or list as JSON; repeatable)",
    )
    run.add_argument("--record", action="store_true", help="record the actor's messages")
    run.add_argument("--run-dir", default="", help="where message logs go (default: current directory)")
    _config_args(run)
    run.set_defaults(func=cmd_actor)
    p = sub.add_parser("tasks", help="OSWorld task files")
    tsub = p.add_subparsers(dest="tasks_cmd", required=True)
    tc = tsub.add_parser("check", help="validate task files; per domain, how many guirl fully supports")
    tc.add_argument("paths", nargs="+", metavar="PATH", help="task files, directories, or meta lists")
    tc.set_defaults(func=cmd_tasks_check)
    tg = tsub.add_parser(
        "generate", help="write a suite of the targets family (train, held-out test, reference solutions)"
    )
    tg.add_argument("family", choices=["targets"], help="the task family (guirl/vmpool/targets.py)")
    tg.add_argument("--out", required=True, metavar="DIR", help="suite directory to write")
    tg.add_argument("--train", type=int, default=256, help="training tasks (default 256)")
    tg.add_argument("--test", type=int, default=64, help="held-out tasks, other seeds (default 64)")
    tg.add_argument("--kinds", default="click", help="comma-separated: click, type, menu (default click)")
    tg.add_argument("--width", type=int, default=640, help="screen width the tasks are drawn for")
    tg.add_argument("--height", type=int, default=400, help="screen height the tasks are drawn for")
    tg.add_argument("--seed", type=int, default=0, help="first training seed")
    tg.add_argument(
        "--hard-labels",
        type=int,
        default=0,
        metavar="N",
        help="keep N colours out of train and test for a harder test-labels.json split",
    )
    tg.add_argument(
        "--goals",
        default="any",
        help="colours train and test tasks ask for, comma-separated (default any: whichever is drawn)",
    )
    tg.set_defaults(func=cmd_tasks_generate)
    p = sub.add_parser("vm", help="a local VM (screenshots, running a task with actions); the cloud reaper")
    from guirl.vmpool.cli import add_arguments as vm_arguments

    vm_arguments(p)
    p.set_defaults(func=lambda a: __import__("guirl.vmpool.cli", fromlist=["run"]).run(a))
    p = sub.add_parser("keys", help="CURVE keys that encrypt and authenticate a cluster's sockets")
    ksub = p.add_subparsers(dest="keys_cmd", required=True)
    ki = ksub.add_parser("init", help="create a key directory: the cluster keypair and authorized/")
    ki.add_argument("dir", metavar="DIR", help="directory to create (mode 0700)")
    ki.add_argument("--force", action="store_true", help="replace an existing key directory (new keys)")
    ki.set_defaults(func=cmd_keys_init)
    p = sub.add_parser("model", help="model checkpoints")
    msub = p.add_subparsers(dest="model_cmd", required=True)
    mt = msub.add_parser("tiny", help="write a tiny random Qwen3-VL checkpoint in Hugging Face format")
    mt.add_argument("outdir", metavar="OUTDIR", help="directory to write (created if missing)")
    mt.add_argument("--seed", type=int, default=0, help="weight initialisation seed (same seed, same bytes)")
    mt.add_argument("--hidden", type=int, default=128, help="text hidden size")
    mt.add_argument("--layers", type=int, default=2, help="text decoder layers")
    mt.add_argument(
        "--thinking",
        action="store_true",
        help="a Qwen3-VL-Thinking-style chat template (<think> generation prompt, past reasoning left out)",
    )
    mt.set_defaults(func=cmd_model_tiny)
    p = sub.add_parser("prm", help="the process reward model's judge")
    psub = p.add_subparsers(dest="prm_cmd", required=True)
    ps = psub.add_parser(
        "score",
        help="judge every step of a finished run's episodes; per-step scores beside them, and a summary",
        description="The judge is this command's configuration ([prm], model.prm_model_path or "
        "PRM_MODEL_PATH), not the run's.",
    )
    ps.add_argument("run_dir", metavar="RUN_DIR", help="directory of an eval or train run")
    _config_args(ps)
    ps.add_argument("--limit", type=int, default=0, help="only the first N episodes (sorted; 0 = all)")
    ps.add_argument(
        "--overwrite", action="store_true", help="replace the per-step files of an earlier scoring"
    )
    ps.add_argument(
        "--out",
        default="prm_offline.jsonl",
        metavar="NAME",
        help="per-step file written in each episode folder (default prm_offline.jsonl)",
    )
    ps.set_defaults(func=cmd_prm_score)
    p = sub.add_parser("status", help="what a local run is doing now: actors, episodes in flight, weights")
    p.add_argument("run_dir", help="the run directory (runs/<name>-<time>-<id>)")
    p.add_argument("--json", action="store_true", help="the status as JSON, as the run wrote it")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser(
        "runs",
        help="the runs under a directory (mode, start, state, progress, figures); `runs show RUN`: one again",
        description="guirl runs [DIR]: every run under DIR (default: run.root_dir), newest first. "
        "guirl runs show RUN: a run's summary and tables, as printed at its end.",
    )
    p.add_argument("words", nargs="*", metavar="DIR | show RUN", help="a results directory, or `show RUN`")
    _config_args(p)
    p.set_defaults(func=cmd_runs)
    p = sub.add_parser(
        "view",
        help="a run as a static site (run page, task table, episodes with their actions drawn, compare)",
        description="guirl view RUN_DIR: writes RUN_DIR/view/, a site that works from file:// and offline "
        "(open view/index.html). --serve serves it on 127.0.0.1 and rebuilds it as the run writes.",
    )
    p.add_argument("run_dir", help="a run directory, or a folder of runs (guirl learn's)")
    p.add_argument("--compare", metavar="OTHER_RUN", help="also compare this run with another, task by task")
    p.add_argument(
        "--versions",
        nargs=2,
        metavar=("A", "B"),
        help="compare two evaluation rounds of a train run (default: its first and last)",
    )
    p.add_argument("--serve", action="store_true", help="serve on loopback, rebuilding while the run goes on")
    p.add_argument("--port", type=int, default=8765, help="the port for --serve (0: any free one)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between looks for changes (--serve)")
    p.set_defaults(func=cmd_view)
    p = sub.add_parser("version", help="print the version")
    p.set_defaults(func=lambda a: print(__version__) or 0)
    _mark(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    from guirl.config import ConfigError
    from guirl.errors import InputError
    from guirl.runtime.errors import FatalError

    args, extras = build_parser().parse_known_args(argv)
    chosen: Parser = args._parser
    if extras:
        chosen.unrecognized(extras)
    if any(getattr(args, a.dest) is None for a in chosen.subcommands()):
        chosen.print_help()  # a command group alone (or `guirl` alone): what it offers
        return 0
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"guirl: configuration error: {exc}", file=sys.stderr)
        return 2
    except FatalError as exc:
        print(f"guirl: {exc}", file=sys.stderr)
        return 1
    except InputError as exc:
        print(f"guirl: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
