"""The command line as a user meets it (issue 23): `--version`, a group alone, defaults in every help,
suggestions for mistypes, `--dry-run` that checks what a start checks, and config-relative paths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from guirl import __version__
from guirl.cli import build_parser, main
from guirl.config import load_config
from guirl.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory, and none of GUI-RL's variables set."""
    for name in ("GUI_EVAL_TASKS", "GUI_TRAIN_TASKS", "HF_CKPT", "GUI_INFERENCE_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"guirl {__version__}"


@pytest.mark.parametrize("group", [[], ["config"], ["tasks"], ["keys"], ["model"], ["prm"], ["data"], ["vm"]])
def test_a_group_alone_prints_its_help(group: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(group) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: guirl {' '.join(group)}".rstrip()) and "options:" in out


def _helps(parser, path=()):
    """Every (command path, parser) below `parser`."""
    yield path, parser
    for action in parser.subcommands():
        for name, child in action.choices.items():
            yield from _helps(child, (*path, name))


def test_every_option_with_a_default_shows_it_in_its_help() -> None:
    missing = []
    for path, parser in _helps(build_parser()):
        for action in parser._actions:
            shown = action.default not in (None, False, [], "==SUPPRESS==")
            if action.option_strings and shown and action.help:
                text = parser._get_formatter()._expand_help(action)
                if "default" not in text:
                    missing.append(f"{' '.join(path)} {action.option_strings[0]}")
    assert missing == []
    # a flag that sets a config key names it and the key's default
    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert "[env.workers; default 1]" in help_text and "[train.domains; default: all]" in help_text


def test_a_mistyped_flag_gets_its_subcommands_usage_and_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["eval", "--confg", "x.toml"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith("usage: guirl eval ")
    assert "unrecognized arguments: --confg (did you mean --config?) x.toml" in err
    with pytest.raises(SystemExit):
        main(["evl"])
    assert "did you mean 'eval'?" in capsys.readouterr().err


def test_a_mistyped_key_gets_a_suggestion(elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--set", "train.lrr=1"]) == 2
    assert "unknown key 'train.lrr' (from --set); did you mean 'train.lr'?" in capsys.readouterr().err


def test_train_takes_the_task_selection_and_backend_flags_eval_has(elsewhere: Path) -> None:
    args = build_parser().parse_args(
        ["train", "--domain", "terminal", "--limit", "2", "--backend", "sglang", "--vms-per-worker", "3"]
    )
    from guirl.cli.main import _settings

    _settings(args, "train")
    cfg = load_config(None, env={}, overrides=args.set)
    assert (cfg.train.domains, cfg.train.limit, cfg.inference.backend) == (["terminal"], 2, "sglang")
    assert cfg.env.vms_per_worker == 3


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["eval", "--tasks", "nope.json"], "cannot read the task list"),
        (["eval", "--domain", "nope"], "no domain(s) ['nope']"),
        (["train", "--resume", "no-such-run"], "--resume no-such-run: not a run directory"),
        (["eval", "--ckpt", ""], "no policy checkpoint: set HF_CKPT"),
        (["eval", "--ckpt", "Org/not-in-any-cache"], "model.hf_ckpt"),
    ],
)
def test_dry_run_fails_on_what_a_start_would_refuse(
    elsewhere: Path, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = [
        "--config",
        str(ROOT / "configs" / ("local_rl.toml" if argv[0] == "train" else "local_eval.toml")),
    ]
    assert main([*argv, *config, "--dry-run"]) == 2
    assert said in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []  # nothing started, nothing written


def test_dry_run_says_every_problem_at_once(elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(ROOT / "configs" / "local_eval.toml")
    argv = ["eval", "--config", config, "--tasks", "nope.json", "--ckpt", "", "--set", "env.provider=aws"]
    assert main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "3 problem(s)" in err and "cloud.cluster_cidr (GUI_CLUSTER_CIDR)" in err
    assert "cannot read the task list" in err and "no policy checkpoint" in err


def test_paths_in_a_config_file_are_its_directorys(
    elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a copy of the shipped config and suite elsewhere: its `../tasks/local/test.json` is the copy's
    tree = elsewhere / "project"
    (tree / "configs").mkdir(parents=True)
    shutil.copy2(ROOT / "configs" / "local_eval.toml", tree / "configs")
    shutil.copytree(ROOT / "tasks" / "local", tree / "tasks" / "local")
    cfg = load_config(tree / "configs" / "local_eval.toml", env={})
    assert cfg.eval.tasks == str(tree / "tasks" / "local" / "test.json")
    # the command line's are the working directory's
    cfg = load_config(tree / "configs" / "local_eval.toml", env={}, overrides=["eval.tasks=mine.json"])
    assert cfg.eval.tasks == str(elsewhere / "mine.json")
    assert main(["eval", "--config", str(tree / "configs" / "local_eval.toml"), "--dry-run"]) == 0
    assert f"tasks {tree / 'tasks' / 'local' / 'test.json'}" in capsys.readouterr().out
    # what a run saves is absolute: its config.toml means the same from anywhere
    assert Path(
        load_config(tree / "configs" / "local_eval.toml", env={}).inference.scripted.dir
    ).is_absolute()


def test_tasks_check_of_a_missing_file_prints_no_table(
    elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tasks", "check", "nope.json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "nope.json" in err


def test_a_hugging_face_id_is_found_in_the_local_cache(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model named as every user names one resolves through HF_HOME's cache, laid out as huggingface_hub
    lays it out; one not there is an error saying how to download it (nothing is downloaded here)."""
    from guirl.model.checkpoints import resolve_checkpoint
    from guirl.model.tiny import write_tiny_checkpoint

    home = elsewhere / "hf-home"
    snapshot = home / "hub" / "models--Org--tiny-vl" / "snapshots" / ("ab" * 20)
    write_tiny_checkpoint(snapshot)
    (home / "hub" / "models--Org--tiny-vl" / "refs").mkdir()
    (home / "hub" / "models--Org--tiny-vl" / "refs" / "main").write_text("ab" * 20)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    for backend in ("hf", "sglang"):  # an SGLang server is given the snapshot, never the id to fetch
        cfg = load_config(
            None, env={}, overrides=["model.hf_ckpt=Org/tiny-vl", f"inference.backend={backend}"]
        )
        assert resolve_checkpoint(cfg) == str(snapshot)
    config = str(ROOT / "configs" / "local_eval.toml")
    assert main(["eval", "--config", config, "--ckpt", "Org/tiny-vl", "--dry-run"]) == 0
    assert main(["eval", "--config", config, "--ckpt", "Org/elsewhere", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"no complete snapshot of it in the local Hugging Face cache ({home / 'hub'})" in err
    assert "hf download Org/elsewhere" in err
    assert sorted(p.name for p in elsewhere.iterdir()) == ["hf-home"]  # nothing fetched, nothing written


def test_a_run_saved_by_an_earlier_guirl_keeps_its_working_directory_paths(elsewhere: Path) -> None:
    """Saved configs are absolute now; one an earlier guirl saved has paths relative to where that run
    was started, and `--resume` from there still finds them."""
    run = elsewhere / "runs" / "old-run"
    run.mkdir(parents=True)
    (run / "config.toml").write_text('[eval]\ntasks = "tasks/local/test.json"\n')
    (run / "episodes.jsonl").write_text("")
    assert load_config(run / "config.toml", env={}).eval.tasks == str(elsewhere / "tasks/local/test.json")
    (run / "episodes.jsonl").unlink()  # a config file anywhere else: its own directory's
    assert load_config(run / "config.toml", env={}).eval.tasks == str(run / "tasks/local/test.json")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["train", "--tasks", "tasks/local/train.json"], "--tasks names an OSWorld task list"),
        (["train", "--domain", "web"], "train.domains (--domain) chooses OSWorld tasks"),
        (["eval", "--skip-unsupported"], "eval.skip_unsupported (--skip-unsupported) chooses OSWorld"),
    ],
)
def test_gui_r1_mode_refuses_the_task_flags_it_would_ignore(
    elsewhere: Path, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ["--config", str(ROOT / "configs" / "gui_r1.toml"), "--dry-run"]
    assert main([*argv, *config]) == 2
    assert said in capsys.readouterr().err


def test_gui_r1_train_takes_limit_as_its_rows(elsewhere: Path) -> None:
    from guirl import roles
    from guirl.cli.main import _settings

    args = build_parser().parse_args(["train", "--limit", "5"])
    _settings(args, "train")
    cfg = load_config(ROOT / "configs" / "gui_r1.toml", env={}, overrides=args.set)
    rows, skipped = roles.suite(cfg, "train")
    assert len(rows) == 5 and skipped == []


def _finished_eval(run: Path, steps: bool = True, **settings: str) -> None:
    """A run directory as an eval's session leaves it: its config, 2 results (tasks a and b), 4 episodes
    (one an environment error, one of task c that never ended scored) and their steps (`steps=False`: a
    ledger an earlier guirl wrote, its steps in the results only)."""
    from guirl.config import save_resolved

    overrides = [f"{k}={v}" for k, v in settings.items()]
    cfg = load_config(ROOT / "configs" / "local_eval.toml", env={}, overrides=overrides)
    run.mkdir(parents=True)
    save_resolved(cfg, run)
    played = [
        ("ep00001", "a", "retried", "vm lost", 2),
        ("ep00002", "a", "completed", "", 7),
        ("ep00003", "b", "completed", "", 4),
        ("ep00004", "c", "retried", "vm lost", 3),
    ]
    lines = []
    for eid, task, status, err, n in played:
        lines.append({"kind": "assigned", "episode_id": eid, "task_id": task})
        end = {"kind": "ended", "episode_id": eid, "status": status, "env_error": err, "score": 1.0}
        lines.append({**end, "steps": n} if steps else end)
    (run / "episodes.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    results = [
        {
            "task_id": t,
            "domain": "os",
            "status": "completed",
            "score": 1.0,
            "outcome": "success",
            "episode_id": e,
            "attempts": 1,
            "steps": n,
            "env_errors": [],
            "seconds": 1.0,
        }
        for t, e, n in (("a", "ep00002", 7), ("b", "ep00003", 4))
    ]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))


def test_a_resumed_eval_carries_its_earlier_sessions_counts(elsewhere: Path) -> None:
    from guirl.eval import earlier_sessions

    run = elsewhere / "run"
    _finished_eval(run)
    cfg = load_config(run / "config.toml", env={})
    earlier = earlier_sessions(cfg, run)
    assert {r.task_id for r in earlier.results} == {"a", "b"}
    assert (earlier.episodes, earlier.steps, earlier.env_errors, earlier.last_seq) == (4, 16, 2, 4)
    # a smaller suite: the results, episodes and steps of its tasks only; numbering goes on from the last
    earlier = earlier_sessions(cfg, run, suite={"a"})
    assert [r.task_id for r in earlier.results] == ["a"]
    assert (earlier.episodes, earlier.steps, earlier.env_errors, earlier.last_seq) == (2, 9, 1, 4)
    # a ledger without steps (an earlier guirl's): the scored episodes' steps come from their results
    old = elsewhere / "old"
    _finished_eval(old, steps=False)
    assert earlier_sessions(cfg, old).steps == 11


def test_a_run_saved_with_relative_paths_by_an_earlier_guirl_resumes(elsewhere: Path) -> None:
    """Its relative checkpoint path is read as a resume reads it (from where it was started), not taken
    for a change."""
    from guirl.eval import earlier_sessions

    run = elsewhere / "runs" / "old"
    _finished_eval(run)
    (elsewhere / "ckpts" / "m").mkdir(parents=True)
    text = (run / "config.toml").read_text().replace('hf_ckpt = "tiny"', 'hf_ckpt = "ckpts/m"')
    assert "ckpts/m" in text
    (run / "config.toml").write_text(text)
    cfg = load_config(run / "config.toml", env={})
    assert cfg.model.hf_ckpt == str(elsewhere / "ckpts" / "m")
    assert earlier_sessions(cfg, run).episodes == 4
    # a setting that came later: the run played as guirl did before it (screenshots without the pointer)
    lines = (run / "config.toml").read_text().splitlines()
    (run / "config.toml").write_text("\n".join(x for x in lines if not x.startswith("screenshot_cursor")))
    with pytest.raises(InputError, match="env.screenshot_cursor: was False, now True"):
        earlier_sessions(load_config(run / "config.toml", env={}), run)
    off = load_config(run / "config.toml", env={}, overrides=["env.screenshot_cursor=false"])
    assert earlier_sessions(off, run).episodes == 4


def test_a_resumed_eval_refuses_settings_that_would_score_otherwise(
    elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = elsewhere / "run"
    _finished_eval(run, **{"agent.temperature": "0.5"})
    argv = ["eval", "--resume", str(run), "--dry-run"]
    assert main(argv) == 0, capsys.readouterr().err  # as saved: nothing changed
    capsys.readouterr()
    assert main([*argv, "--set", "agent.temperature=1.0", "--backend", "scripted"]) == 2
    err = capsys.readouterr().err
    assert "agent.temperature: was 0.5, now 1.0" in err
    assert "inference.backend: was 'hf', now 'scripted'" in err and "--set KEY=VALUE" in err
    assert main([*argv, "--set", "inference.max_batch=2"]) == 0  # how it is served is free to change
    assert main([*argv, "--set", "inference.openai.model=other"]) == 0  # another backend's setting
    assert main([*argv, "--set", "inference.hf.dtype=bfloat16"]) == 2  # this backend's
