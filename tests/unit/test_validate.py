"""Every rule between config fields lives in `guirl.config.validate`, and `load_config(mode=...)`, the
drivers and `--dry-run` apply the same ones: each rule is tried here through `load_config`, as a user
meets it."""

import pytest

from guirl.config import ConfigError, load_config
from guirl.config.validate import validate
from guirl.errors import InputError

TRAINABLE = ["inference.backend=hf", "train.updates=2"]
SIMULATED = [
    "inference.backend=scripted",
    "inference.scripted.tokens=true",
    "train.updates=2",
    "train.simulated_update_s=0.5",
]


def _load(*overrides: str, mode: str | None = None):
    return load_config(None, env={}, overrides=list(overrides), mode=mode)


@pytest.mark.parametrize(
    ("mode", "overrides", "said"),
    [
        ("eval", ["chaos.seed=3", "chaos.busy=2"], "set runtime.fault_injection = true"),
        (
            "train",
            [
                *TRAINABLE,
                "cluster.num_gpus=4",
                "cluster.rollout_gpus=1",
                "cluster.actor_gpus=2",
                "train.device=cuda",
                "train.ranks=2",
            ],
            "= 3, but NUM_GPUS is 4: they must add up",
        ),
        (
            "train",
            [
                *TRAINABLE,
                "cluster.num_gpus=3",
                "cluster.rollout_gpus=1",
                "cluster.actor_gpus=2",
                "train.device=cuda",
            ],
            "train.ranks (1) must equal ACTOR_GPUS (2)",
        ),
        (
            "train",
            [
                *TRAINABLE,
                "cluster.num_gpus=3",
                "cluster.rollout_gpus=1",
                "cluster.actor_gpus=1",
                "cluster.prm_gpus=1",
                "train.device=cuda",
            ],
            "PRM_GPUS is 1, but the PRM is off",
        ),
        (
            "eval",
            ["inference.backend=sglang", "cluster.num_gpus=2", "cluster.rollout_gpus=4"],
            "ROLLOUT_GPUS (4) is more than NUM_GPUS (2)",
        ),
        (
            "eval",
            ["inference.backend=sglang", "cluster.rollout_gpus=4", "inference.sglang.tp_size=3"],
            "ROLLOUT_GPUS (4) is not a positive multiple of inference.sglang.tp_size (3)",
        ),
        (
            "train",
            [
                "inference.backend=sglang",
                "train.updates=2",
                "cluster.num_gpus=4",
                "cluster.actor_gpus=1",
                "cluster.rollout_gpus=1",
                "cluster.prm_gpus=2",
                "prm.enabled=true",
                "prm.backend=sglang",
                "prm.sglang.tp_size=3",
                "train.device=cuda",
            ],
            "PRM_GPUS (2) is not a positive multiple of prm.sglang.tp_size (3)",
        ),
        ("eval", ["agent.prompt_style=gui-rl", "agent.response_format=gui_r1"], "agent.response_format"),
        (
            "eval",
            ["agent.prompt_style=gui-rl", "agent.response_format=computer_use", "inference.backend=openai"],
            'needs inference.backend "hf" or "sglang"',
        ),
        (
            "eval",
            ["env.provider=aws"],
            "env.provider = 'aws' needs cloud.cluster_cidr (GUI_CLUSTER_CIDR), cloud.aws.image_id, ",
        ),
        (
            "eval",
            ["env.provider=volcengine", "cloud.volcengine.image_id=img"],
            "needs cloud.cluster_cidr (GUI_CLUSTER_CIDR), cloud.volcengine.access_key (VOLC_ACCESSKEY), "
            "cloud.volcengine.secret_key (VOLC_SECRETKEY), "
            "cloud.volcengine.subnet_id (VOLCENGINE_SUBNET_ID), "
            "cloud.volcengine.security_group_id (VOLCENGINE_SECURITY_GROUP_ID)",
        ),
        ("eval", ["env.provider=aws", "cloud.cluster_cidr=0.0.0.0/0"], "would open the VM server"),
        ("eval", ["env.provider=aws", "cloud.cluster_cidr=10.0.0.0/16"], "needs cloud.aws.image_id"),
        ("train", ["inference.backend=scripted", "train.updates=2"], "training needs the engine's token ids"),
        ("train", ["inference.backend=hf"], "train.updates must be set"),
        (
            "train",
            [*TRAINABLE, "agent.max_steps=30", "codec.max_frames=64"],
            "codec.max_frames = 64 is below the 122 frames a trajectory of agent.max_steps = 30 steps",
        ),
        (
            "train",
            [*TRAINABLE, "train.simulated_update_s=1"],
            'needs engines without one: inference.backend = "scripted" with inference.scripted.tokens',
        ),
        (
            "train",
            ["inference.backend=scripted", "train.updates=2", "train.simulated_update_s=1"],
            "inference.scripted.tokens = true",
        ),
        (
            "train",
            [*SIMULATED, "train.ranks=2"],
            "train.simulated_update_s is one learner rank: set train.ranks = 1",
        ),
        ("train", [*TRAINABLE, "train.advantage=step_wise"], "needs PRM scores"),
        (
            "train",
            [*TRAINABLE, "data.train=rows.jsonl", "prm.enabled=true", "train.advantage=step_wise"],
            'GUI-R1 mode is "grpo"',
        ),
        ("train", [*TRAINABLE, "data.train=rows.jsonl", "train.eval_every=1"], "needs data.eval"),
    ],
)
def test_each_rule_refuses_with_the_keys_to_set(mode, overrides, said):
    with pytest.raises(InputError) as err:
        _load(*overrides, mode=mode)
    assert said in str(err.value)


def test_a_simulated_learner_trains_on_scripted_tokens():
    cfg = _load(*SIMULATED, mode="train")
    assert cfg.train.simulated_update_s == 0.5 and cfg.inference.scripted.tokens


def test_a_mode_rule_waits_for_its_mode():
    # a config can be loaded (and printed, `guirl config show`) before its cloud settings, train budget or
    # fault-injection switch are given
    cfg = _load("env.provider=aws", "inference.backend=scripted", "chaos.seed=3", "chaos.busy=2")
    validate(cfg)
    with pytest.raises(InputError):
        validate(cfg, "eval")
    # GUI-R1 mode plays rows, not desktops: no cloud is needed for them
    validate(_load("env.provider=aws", "data.eval=rows.jsonl"), "eval")
    # a train run in GUI-R1 mode whose evaluations have their rows
    validate(_load(*TRAINABLE, "data.train=a.jsonl", "data.eval=b.jsonl", "train.eval_every=1"), "train")


def test_an_unknown_mode_is_a_programming_error():
    with pytest.raises(ValueError, match="mode must be"):
        validate(_load(), "evaluate")


def test_a_renamed_key_is_read_as_its_new_name(tmp_path, caplog):
    # a run directory saved before `[faults]` existed still loads (`guirl train --resume` reads it)
    saved = tmp_path / "config.toml"
    saved.write_text("[eval]\nfault_kill_vm_at_step = 2\n\n[train]\nfault_kill_learner_at_version = 3\n")
    cfg = load_config(saved, env={}, overrides=["train.fault_kill_prm_at_version=4"])
    assert (
        cfg.faults.kill_vm_at_step,
        cfg.faults.kill_learner_at_version,
        cfg.faults.kill_prm_at_version,
    ) == (
        2,
        3,
        4,
    )
    assert "eval.fault_kill_vm_at_step is now faults.kill_vm_at_step" in caplog.text
    # both names in one source: which one counts would depend on their order, so neither does
    for text in (
        "[faults]\nkill_vm_at_step = 5\n\n[eval]\nfault_kill_vm_at_step = 2\n",
        "[eval]\nfault_kill_vm_at_step = 2\n\n[faults]\nkill_vm_at_step = 5\n",
    ):
        saved.write_text(text)
        with pytest.raises(ConfigError, match="are one setting, given twice .*: keep faults.kill_vm_at_step"):
            load_config(saved, env={})
    # in different sources, the later one wins as for any key
    saved.write_text("[eval]\nfault_kill_vm_at_step = 2\n")
    assert load_config(saved, env={}, overrides=["faults.kill_vm_at_step=5"]).faults.kill_vm_at_step == 5


def test_every_broken_rule_is_said_at_once():
    with pytest.raises(InputError) as err:
        _load("env.provider=aws", "inference.backend=scripted", "chaos.seed=3", "chaos.busy=2", mode="train")
    said = str(err.value)
    assert said.startswith("3 problems:\n")
    for part in (
        "runtime.fault_injection",
        "cloud.cluster_cidr (GUI_CLUSTER_CIDR)",
        "training needs the engine",
    ):
        assert part in said


def test_a_misspelt_key_gets_a_suggestion():
    with pytest.raises(
        ConfigError, match=r"unknown key 'train.lrr' \(from --set\); did you mean 'train.lr'\?"
    ):
        _load("train.lrr=1")
    with pytest.raises(ConfigError, match=r"unknown key 'trian' .*did you mean 'train'\?"):
        _load("trian.lr=1")


def test_replayed_desktops_need_a_recording_and_typed_actions(tmp_path):
    with pytest.raises(InputError, match="needs env.replay.run"):
        _load("env.provider=replay", "env.action_space=computer_use", mode="eval")
    with pytest.raises(InputError, match="not a run directory"):
        _load(
            "env.provider=replay", f"env.replay.run={tmp_path}", "env.action_space=computer_use", mode="eval"
        )
    (tmp_path / "episodes").mkdir()
    with pytest.raises(InputError, match='set env.action_space = "computer_use"'):
        _load("env.provider=replay", f"env.replay.run={tmp_path}", "env.action_space=pyautogui", mode="eval")
    cfg = _load(
        "env.provider=replay", f"env.replay.run={tmp_path}", "env.action_space=computer_use", mode="eval"
    )
    from guirl.config.validate import check_replay_source

    check_replay_source(cfg, tmp_path / "another-run")
    with pytest.raises(InputError, match="run directory being written"):
        check_replay_source(cfg, tmp_path)  # a resumed run replaying itself


def test_replayed_desktops_need_no_application_installed_here(tmp_path):
    """A recording shows whatever its desktop had (a cloud VM's applications too): a task's applications are
    not looked for on this host, as they are for local desktops."""
    from guirl.roles import run_settings
    from guirl.vmpool.tasks.check import LOCAL_APPS

    (tmp_path / "episodes").mkdir()
    replay = _load("env.provider=replay", f"env.replay.run={tmp_path}", "env.action_space=computer_use")
    assert LOCAL_APPS not in run_settings(replay) and LOCAL_APPS in run_settings(_load())
