"""GPU placement from OpenClaw-RL's GUI-RL variables: every GUI-RL layout, every invalid split, CPU configs,
and `guirl train|eval --dry-run`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from guirl.cli import main
from guirl.config import load_config
from guirl.errors import InputError
from guirl.placement import EnginePlacement, PlacementError, apply, plan
from tests.helpers import CLOUD_ENV

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
GUI_RL_VARS = (
    "NUM_GPUS",
    "ACTOR_GPUS",
    "ROLLOUT_GPUS",
    "PRM_GPUS",
    "HF_CKPT",
    "PRM_MODEL_PATH",
    "GUI_RESULT_DIR",
)


def cfg_of(*overrides: str, env: dict[str, str] | None = None, path: Path | None = None):
    return load_config(path, env=env or {}, overrides=list(overrides))


SGLANG_4_4 = ("inference.backend=sglang", "train.ranks=4")
PRM_4_3_1 = (
    "inference.backend=sglang",
    "train.ranks=4",
    "cluster.rollout_gpus=3",
    "cluster.prm_gpus=1",
    "prm.enabled=true",
    "prm.backend=sglang",
)


# -- GUI-RL's layouts ---------------------------------------------------------------------------------


def test_train_4_4_sglang_layout() -> None:
    cfg = cfg_of(*SGLANG_4_4)
    p = plan(cfg, "train", visible="0,1,2,3,4,5,6,7")
    assert p.visible == tuple("01234567")
    assert p.learner_gpus == ("0", "1", "2", "3") and p.learner_ordinals == (0, 1, 2, 3)
    assert p.learner_env() == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert p.rollout == tuple(EnginePlacement(f"sglang{i}", (str(4 + i),), (4 + i,)) for i in range(4))
    assert p.judge == () and p.notes == ()
    assert apply(cfg, p).inference.engines == 4


def test_train_prm_4_3_1() -> None:
    cfg = cfg_of(*PRM_4_3_1, "inference.engines=7", "prm.engines=5")
    p = plan(cfg, "train", visible="0,1,2,3,4,5,6,7")
    assert p.learner_gpus == ("0", "1", "2", "3")
    assert [(e.name, e.gpus, e.ordinals) for e in p.rollout] == [
        ("sglang0", ("4",), (4,)),
        ("sglang1", ("5",), (5,)),
        ("sglang2", ("6",), (6,)),
    ]
    assert p.judge == (EnginePlacement("judge-sglang0", ("7",), (7,)),)
    applied = apply(cfg, p)
    assert applied.inference.engines == 3 and applied.prm.engines == 1
    text = p.describe(cfg)
    assert "judge: 1 sglang engine, tp 1: judge-sglang0 GPU 7" in text
    assert "rollout: 3 sglang engines, tp 1: sglang0 GPU 4, sglang1 GPU 5, sglang2 GPU 6" in text
    assert "learner: 4 FSDP2 ranks on GPUs 0,1,2,3, NCCL, bf16" in text


def test_eval_all_rollout() -> None:
    cfg = cfg_of("inference.backend=sglang", "cluster.actor_gpus=0", "cluster.rollout_gpus=8")
    p = plan(cfg, "eval", visible="0,1,2,3,4,5,6,7")
    assert p.learner_gpus == () and p.learner_env() == {}
    assert [e.gpus for e in p.rollout] == [(str(i),) for i in range(8)]
    assert [e.ordinals for e in p.rollout] == [(i,) for i in range(8)]
    assert p.notes == ()
    assert apply(cfg, p).inference.engines == 8
    assert "learner" not in p.describe(cfg)


def test_eval_ignores_actor_gpus_and_notes_unused() -> None:
    cfg = cfg_of("inference.backend=sglang", "cluster.actor_gpus=4", "cluster.rollout_gpus=6")
    p = plan(cfg, "eval", visible="0,1,2,3,4,5,6,7")
    assert [e.gpus[0] for e in p.rollout] == ["0", "1", "2", "3", "4", "5"]
    assert len(p.notes) == 1 and "6,7" in p.notes[0] and "unused" in p.notes[0]


def test_tp_size_2() -> None:
    cfg = cfg_of(*SGLANG_4_4, "inference.sglang.tp_size=2")
    p = plan(cfg, "train", visible="0,1,2,3,4,5,6,7")
    assert p.rollout == (
        EnginePlacement("sglang0", ("4", "5"), (4, 5)),
        EnginePlacement("sglang1", ("6", "7"), (6, 7)),
    )
    assert apply(cfg, p).inference.engines == 2
    assert "2 sglang engines, tp 2: sglang0 GPUs 4,5, sglang1 GPUs 6,7" in p.describe(cfg)


def test_cuda_visible_devices_remaps_physical_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", " 3,5,6,7, 0,1,2,4")
    p = plan(cfg_of(*SGLANG_4_4), "train")
    assert p.visible == ("3", "5", "6", "7", "0", "1", "2", "4")
    assert p.learner_gpus == ("3", "5", "6", "7") and p.learner_ordinals == (0, 1, 2, 3)
    assert p.learner_env() == {"CUDA_VISIBLE_DEVICES": "3,5,6,7"}
    assert [(e.gpus, e.ordinals) for e in p.rollout] == [((g,), (4 + i,)) for i, g in enumerate("0124")]


def test_more_visible_than_num_gpus_uses_the_first() -> None:
    cfg = cfg_of(*SGLANG_4_4, "cluster.num_gpus=5", "cluster.rollout_gpus=1")
    p = plan(cfg, "train", visible="7,6,5,4,3,2,1,0")
    assert p.visible == ("7", "6", "5", "4", "3") and p.rollout[0].gpus == ("3",)


def test_hf_cuda_engines_get_ordinals() -> None:
    cfg = cfg_of(
        "inference.hf.device=cuda",
        "train.ranks=4",
        "cluster.rollout_gpus=3",
        "cluster.prm_gpus=1",
        "prm.enabled=true",
        "prm.hf.device=cuda",
    )
    p = plan(cfg, "train", visible="3,5,6,7,0,1,2,4")
    assert p.rollout == (
        EnginePlacement("hf0", ("0",), (4,)),
        EnginePlacement("hf1", ("1",), (5,)),
        EnginePlacement("hf2", ("2",), (6,)),
    )
    assert p.judge == (EnginePlacement("judge-hf0", ("4",), (7,)),)
    assert "hf0 GPU 0 (cuda:4)" in p.describe(cfg)


def test_sglang_attach_one_engine_per_url() -> None:
    urls = '["http://10.0.0.1:30000", "http://10.0.0.2:30000"]'
    cfg = cfg_of("inference.backend=sglang", f"inference.sglang.urls={urls}", "cluster.rollout_gpus=8")
    p = plan(cfg, "eval", visible="0,1,2,3,4,5,6,7")
    assert p.rollout == (
        EnginePlacement("sglang0", (), (), "http://10.0.0.1:30000"),
        EnginePlacement("sglang1", (), (), "http://10.0.0.2:30000"),
    )
    assert apply(cfg, p).inference.engines == 2
    assert any("idle" in n for n in p.notes)


def test_cpu_rollout_with_gpu_learner_keeps_engine_count() -> None:
    cfg = cfg_of("train.device=cuda", "train.ranks=4", "inference.backend=openai", "inference.engines=2")
    p = plan(cfg, "train", visible="0,1,2,3,4,5,6,7")
    assert p.learner_gpus == ("0", "1", "2", "3")
    assert p.rollout == (EnginePlacement("openai0", (), ()), EnginePlacement("openai1", (), ()))
    assert apply(cfg, p) == cfg
    assert any("4,5,6,7" in n and "ROLLOUT_GPUS" in n for n in p.notes)


def test_cpu_learner_with_gpu_rollout() -> None:
    cfg = cfg_of("inference.backend=sglang", "train.device=cpu", "train.ranks=2")
    p = plan(cfg, "train", visible="0,1,2,3,4,5,6,7")
    assert p.learner_gpus == () and p.learner_env() == {}
    assert len(p.rollout) == 4 and any("ACTOR_GPUS" in n for n in p.notes)
    assert "learner: 2 FSDP2 ranks on CPU" in p.describe(cfg)


# -- invalid splits -----------------------------------------------------------------------------------

BAD = {
    "sums": (
        ("inference.backend=sglang", "train.ranks=4", "cluster.rollout_gpus=3"),
        "train",
        ["ACTOR_GPUS (4)", "ROLLOUT_GPUS (3)", "PRM_GPUS (0)", "NUM_GPUS is 8"],
    ),
    "actor 0 in train": (
        ("inference.backend=sglang", "cluster.actor_gpus=0", "cluster.rollout_gpus=8"),
        "train",
        ["ACTOR_GPUS is 0"],
    ),
    "ranks != actor": (
        ("inference.backend=sglang", "train.ranks=2"),
        "train",
        ["train.ranks (2)", "ACTOR_GPUS (4)"],
    ),
    "tp": (
        (*PRM_4_3_1, "inference.sglang.tp_size=2"),
        "train",
        ["ROLLOUT_GPUS (3)", "inference.sglang.tp_size (2)"],
    ),
    "judge tp": (
        (*PRM_4_3_1, "prm.sglang.tp_size=2"),
        "train",
        ["PRM_GPUS (1)", "prm.sglang.tp_size (2)"],
    ),
    "prm gpus with prm off": (
        ("inference.backend=sglang", "train.ranks=4", "cluster.rollout_gpus=3", "cluster.prm_gpus=1"),
        "train",
        ["PRM_GPUS is 1", "prm.enabled"],
    ),
    "gpu judge without prm gpus": (
        ("inference.backend=sglang", "train.ranks=4", "prm.enabled=true", "prm.backend=sglang"),
        "train",
        ["PRM_GPUS is 0", "sglang"],
    ),
    "hf cuda judge without prm gpus": (
        ("inference.backend=sglang", "train.ranks=4", "prm.enabled=true", "prm.hf.device=cuda"),
        "train",
        ["PRM_GPUS is 0", "hf"],
    ),
    "eval rollout > num": (
        ("inference.backend=sglang", "cluster.num_gpus=4", "cluster.rollout_gpus=8"),
        "eval",
        ["ROLLOUT_GPUS (8)", "NUM_GPUS (4)"],
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_invalid_splits_name_the_variables(case: str) -> None:
    overrides, mode, words = BAD[case]
    with pytest.raises(PlacementError) as err:
        plan(cfg_of(*overrides), mode, visible="0,1,2,3,4,5,6,7")
    assert isinstance(err.value, InputError)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize(
    ("visible", "words"),
    [
        ("0,1,2,3", ["CUDA_VISIBLE_DEVICES", "shows 4", "NUM_GPUS is 8"]),
        ("0,1,,2,3,4,5,6,7", ["CUDA_VISIBLE_DEVICES", "empty entry"]),
        ("", ["CUDA_VISIBLE_DEVICES is empty", "NUM_GPUS is 8"]),
        ("0,1,2,3,4,5,6,6", ["CUDA_VISIBLE_DEVICES", "6", "more than once"]),
    ],
)
def test_bad_cuda_visible_devices(visible: str, words: list[str]) -> None:
    with pytest.raises(PlacementError) as err:
        plan(cfg_of(*SGLANG_4_4), "train", visible=visible)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_bad_cuda_visible_devices_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(PlacementError, match="CUDA_VISIBLE_DEVICES='0,1' shows 2"):
        plan(cfg_of(*SGLANG_4_4), "train")


# -- CPU configs and the shipped GPU configs ------------------------------------------------------------


@pytest.mark.parametrize("name", ["local_rl", "local_eval", "local_prm_rl", "gui_r1"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_cpu_configs_use_no_gpus(name: str, mode: str) -> None:
    cfg = cfg_of(path=CONFIGS / f"{name}.toml")
    # the default cluster numbers (8/4/4) do not add up with PRM_GPUS 0 and no PRM, and need not:
    # nothing is checked when no GPU is used, whatever CUDA_VISIBLE_DEVICES says
    p = plan(cfg, mode, visible="")
    assert not p.uses_gpus and p.rollout == p.judge == p.learner_gpus == ()
    assert p.learner_env() == {} and apply(cfg, p) == cfg
    assert "GPUs: none (everything runs on CPU)" in p.describe(cfg)


SHIPPED = {
    "osworld_qwen3vl_8b_rl": ("train", 4, 0),
    "osworld_qwen3vl_8b_prm_rl": ("train", 3, 1),
    "osworld_qwen3vl_4b_eval": ("eval", 8, 0),
}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_gpu_configs_plan(name: str) -> None:
    mode, rollout, judge = SHIPPED[name]
    cfg = cfg_of(path=CONFIGS / f"{name}.toml", env={"HF_CKPT": "/ckpt", "PRM_MODEL_PATH": "/judge"})
    p = plan(cfg, mode, visible="0,1,2,3,4,5,6,7")
    assert p.uses_gpus and len(p.rollout) == rollout and len(p.judge) == judge
    assert p.learner_gpus == (("0", "1", "2", "3") if mode == "train" else ())
    assert all(e.gpus for e in (*p.rollout, *p.judge)) and p.notes == ()
    # the configured engine counts already agree with the plan
    assert apply(cfg, p) == cfg


# -- guirl train|eval --dry-run -------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A clean environment (no GUI-RL variables, no CUDA_VISIBLE_DEVICES) and an empty working directory."""
    for name in (*GUI_RL_VARS, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name in ("ckpt", "judge"):  # checkpoints a dry run finds (their weights are never read)
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text("{}")
    monkeypatch.setenv("HF_CKPT", str(tmp_path / "models" / "ckpt"))
    monkeypatch.setenv("PRM_MODEL_PATH", str(tmp_path / "models" / "judge"))
    for name, value in CLOUD_ENV.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path / "work"


def test_dry_run_prints_the_plan(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--config", str(CONFIGS / "osworld_qwen3vl_8b_rl.toml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan for train (nothing started)\nGPUs: 8 (0,1,2,3,4,5,6,7)\n")
    assert "rollout: 4 sglang engines, tp 1: sglang0 GPU 4" in out
    assert "env: 8 workers, 64 VMs (volcengine)" in out
    assert main(["eval", "--config", str(CONFIGS / "osworld_qwen3vl_4b_eval.toml"), "--dry-run"]) == 0
    assert "rollout: 8 sglang engines" in capsys.readouterr().out
    assert main(["train", "--config", str(CONFIGS / "osworld_qwen3vl_8b_prm_rl.toml"), "--dry-run"]) == 0
    assert "judge-sglang0 GPU 7" in capsys.readouterr().out
    assert list(clean_env.iterdir()) == []  # no run directory (results/), no checkpoint built


def test_dry_run_bad_split_fails_clearly(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ROLLOUT_GPUS", "3")
    assert main(["train", "--config", str(CONFIGS / "osworld_qwen3vl_8b_rl.toml"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "ACTOR_GPUS (4) + ROLLOUT_GPUS (3) + PRM_GPUS (0) = 7, but NUM_GPUS is 8" in err
    assert list(clean_env.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("GUI_CLUSTER_CIDR", "", "cloud.cluster_cidr (GUI_CLUSTER_CIDR)"),
        ("GUI_CLUSTER_CIDR", "0.0.0.0/0", "to the internet"),
        ("GUI_CLUSTER_CIDR", "8.8.0.0/16", "to the internet"),
        ("VOLCENGINE_IMAGE_ID", "", "cloud.volcengine.image_id"),
    ],
)
def test_dry_run_checks_the_cloud_settings(
    clean_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
    value: str,
    says: str,
) -> None:
    monkeypatch.setenv(name, value)
    assert main(["eval", "--config", str(CONFIGS / "osworld_qwen3vl_4b_eval.toml"), "--dry-run"]) == 2
    assert says in capsys.readouterr().err


def test_dry_run_checks_the_checkpoint(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the hf backend loads HF_CKPT itself: a directory without config.json fails before anything starts
    monkeypatch.delenv("HF_CKPT")
    args = ["eval", "--config", str(CONFIGS / "local_eval.toml"), "--dry-run"]
    assert main(args) == 0  # "tiny" is taken as given (built on first use, not by a dry run)
    assert main([*args, "--ckpt", str(clean_env / "nowhere")]) == 2
    assert "not a checkpoint directory" in capsys.readouterr().err
    assert list(clean_env.iterdir()) == []


def test_dry_run_imports_no_torch(tmp_path: Path) -> None:
    code = (
        "import sys; from guirl.cli import main; "
        f"rc = main(['train', '--config', {str(CONFIGS / 'osworld_qwen3vl_8b_rl.toml')!r}, '--dry-run']); "
        "assert rc == 0, rc; assert 'torch' not in sys.modules, 'torch imported'"
    )
    ckpt = tmp_path.parent / f"{tmp_path.name}-ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    env = {"PATH": "/usr/bin:/bin", "HF_CKPT": str(ckpt), "PYTHONPATH": str(ROOT)}
    env.update(CLOUD_ENV)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "plan for train" in out.stdout and list(tmp_path.iterdir()) == []


def test_dry_run_checks_the_prompt_style(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GUI-RL's prompt style has the checkpoint's own template write a tools block: an OpenAI-compatible
    endpoint cannot, and GUI-R1's answer format has no such prompt."""
    args = ["eval", "--config", str(CONFIGS / "osworld_qwen3vl_4b_eval.toml"), "--dry-run"]
    assert main([*args, "--set", "agent.prompt_style=gui-rl"]) == 0
    capsys.readouterr()
    assert main([*args, "--set", "agent.prompt_style=gui-rl", "--set", "inference.backend=openai"]) == 2
    assert 'needs inference.backend "hf" or "sglang"' in capsys.readouterr().err
    assert main([*args, "--set", "agent.prompt_style=gui-rl", "--set", "agent.response_format=gui_r1"]) == 2
    assert 'needs agent.response_format = "computer_use"' in capsys.readouterr().err
    assert main([*args, "--set", "agent.prompt_style=gui_rl"]) == 2  # a typo names the choices
    assert "expected one of 'guirl', 'gui-rl'" in capsys.readouterr().err
