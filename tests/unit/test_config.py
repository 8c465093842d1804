"""Config tree: layering, env conversion, error messages, docs, TOML round trip, run dirs."""

import re
import tomllib
from pathlib import Path

import msgspec
import pytest

from guirl.config import (
    ENV_VARS,
    SECRET_KEYS,
    ConfigError,
    GuirlConfig,
    describe,
    field_docstrings,
    load_config,
    make_run_dir,
    save_resolved,
    to_toml,
)
from guirl.config.loader import SOURCE_TREE


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_load() -> None:
    cfg = load_config(env={})
    # the default paths name guirl's shipped tasks, from anywhere
    shipped = SOURCE_TREE / "tasks" / "local"
    assert (cfg.eval.tasks, cfg.train.tasks) == (str(shipped / "test.json"), str(shipped / "train.json"))
    assert cfg.inference.scripted.dir == str(shipped / "solutions")
    relative = msgspec.structs.replace(
        cfg,
        eval=msgspec.structs.replace(cfg.eval, tasks=GuirlConfig().eval.tasks),
        train=msgspec.structs.replace(cfg.train, tasks=GuirlConfig().train.tasks),
        inference=msgspec.structs.replace(cfg.inference, scripted=GuirlConfig().inference.scripted),
    )
    assert relative == GuirlConfig()
    assert cfg.runtime.heartbeat_interval_s == 1.0
    assert cfg.codec.max_frame_bytes == 64 * 2**20
    assert cfg.recorder.directions == ["in", "out"]
    assert cfg.env.provider == "local"
    assert cfg.cloud.volcengine.secret_key == ""


def test_default_lists_are_not_shared() -> None:
    a, b = GuirlConfig(), GuirlConfig()
    a.recorder.directions.append("in")
    assert b.recorder.directions == ["in", "out"]


def test_file_overrides_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[run]\nname = "exp"\n[runtime]\nheartbeat_liveness = 5\n[cloud.volcengine]\nimage_id = "img"\n',
    )
    cfg = load_config(path, env={})
    assert cfg.run.name == "exp"
    assert cfg.runtime.heartbeat_liveness == 5
    assert cfg.cloud.volcengine.image_id == "img"
    assert cfg.runtime.heartbeat_interval_s == 1.0  # untouched fields keep defaults


def test_precedence_file_env_set(tmp_path: Path) -> None:
    path = write(tmp_path, "[cluster]\nnum_gpus = 2\nactor_gpus = 1\n[rollout]\nbatch_size = 3\n")
    env = {"NUM_GPUS": "4", "ROLLOUT_BATCH_SIZE": "5"}
    cfg = load_config(path, env=env, overrides=["cluster.num_gpus=6"])
    assert cfg.cluster.num_gpus == 6  # --set beats env beats file
    assert cfg.rollout.batch_size == 5  # env beats file
    assert cfg.cluster.actor_gpus == 1  # file beats default


def test_env_strings_are_converted_to_field_types() -> None:
    env = {
        "NUM_GPUS": "16",
        "GUI_SCREEN_WIDTH": "1280",
        "GUI_PROVIDER_NAME": "volcengine",
        "GUI_RESULT_DIR": "/data/runs",
        "HF_CKPT": "123",  # a str field keeps digits as text
        "UNRELATED": "ignored",
    }
    cfg = load_config(env=env)
    assert cfg.cluster.num_gpus == 16
    assert cfg.env.screen_width == 1280
    assert cfg.env.provider == "volcengine"
    assert cfg.run.root_dir == "/data/runs"
    assert cfg.model.hf_ckpt == "123"


def test_set_values_parse_as_toml_else_string() -> None:
    cfg = load_config(
        env={},
        overrides=[
            "runtime.request_timeout_s=2.5",
            "recorder.enabled=true",
            'recorder.directions=["in"]',
            "run.name=my run",
            "model.hf_ckpt=42",
            'run.root_dir="/tmp/x"',
            "demo.kill_one=false",
        ],
    )
    assert cfg.runtime.request_timeout_s == 2.5
    assert cfg.recorder.enabled is True
    assert cfg.recorder.directions == ["in"]
    assert cfg.run.name == "my run"
    assert cfg.model.hf_ckpt == "42"
    assert cfg.run.root_dir == "/tmp/x"
    assert cfg.demo.kill_one is False


def test_int_accepted_for_float_field() -> None:
    assert load_config(env={}, overrides=["runtime.heartbeat_interval_s=2"]).runtime.heartbeat_interval_s == 2


def error_message(*args: object, **kwargs: object) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


def test_bad_value_from_set_names_key_value_and_source() -> None:
    msg = error_message(env={}, overrides=["runtime.heartbeat_interval_s=-1"])
    assert msg.startswith("runtime.heartbeat_interval_s: expected a number > 0")
    assert "got -1" in msg and msg.endswith("(from --set)")


def test_unknown_key_in_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[runtime]\nheartbeat_intervall = 1.0\n")
    assert error_message(path, env={}) == (
        f"unknown key 'runtime.heartbeat_intervall' (from {path}); "
        "did you mean 'runtime.heartbeat_interval_s'?"
    )


def test_unknown_section_in_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[nosuch]\nx = 1\n")
    assert error_message(path, env={}) == f"unknown key 'nosuch' (from {path})"


def test_unknown_key_from_set() -> None:
    assert error_message(env={}, overrides=["demo.stepz=3"]) == (
        "unknown key 'demo.stepz' (from --set); did you mean 'demo.steps'?"
    )
    assert error_message(env={}, overrides=["run.name.x=3"]) == "unknown key 'run.name.x' (from --set)"


def test_malformed_set_without_equals() -> None:
    msg = error_message(env={}, overrides=["runtime.sndhwm"])
    assert "runtime.sndhwm" in msg and "key=value" in msg and "--set" in msg


def test_invalid_toml_file_names_file_and_parser_message(tmp_path: Path) -> None:
    path = write(tmp_path, "[run\nname = 1\n")
    msg = error_message(path, env={})
    assert str(path) in msg
    with pytest.raises(tomllib.TOMLDecodeError) as parser:
        tomllib.loads(path.read_text())
    assert str(parser.value) in msg


def test_missing_file_names_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    assert str(path) in error_message(path, env={})


def test_wrong_type_in_file_names_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[cluster]\nnum_gpus = "eight"\n')
    msg = error_message(path, env={})
    assert msg == f"cluster.num_gpus: expected an integer, got 'eight' (from {path})"


def test_bad_env_value_names_variable() -> None:
    msg = error_message(env={"NUM_GPUS": "many"})
    assert msg.startswith("cluster.num_gpus:") and "'many'" in msg and "NUM_GPUS" in msg
    msg = error_message(env={"PRM_GPUS": "-1"})
    assert msg.startswith("cluster.prm_gpus:") and "'-1'" in msg and "PRM_GPUS" in msg


def test_bad_enum_lists_choices() -> None:
    msg = error_message(env={"GUI_PROVIDER_NAME": "gcp"})
    assert msg == (
        "env.provider: expected one of 'local', 'replay', 'aws', 'volcengine', 'aliyun', got 'gcp' "
        "(from env GUI_PROVIDER_NAME)"
    )
    msg = error_message(env={}, overrides=['recorder.directions=["in", "sideways"]'])
    assert msg.startswith("recorder.directions: expected one of 'in', 'out'") and "--set" in msg


def test_scalar_for_section_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "runtime = 3\n")
    assert error_message(path, env={}) == f"runtime: expected a table, got 3 (from {path})"


def test_later_source_is_blamed(tmp_path: Path) -> None:
    # The file's value is fine; the env value that replaced it is the one at fault.
    path = write(tmp_path, "[env]\nscreen_width = 800\n")
    msg = error_message(path, env={"GUI_SCREEN_WIDTH": "0"})
    assert msg.startswith("env.screen_width:") and "GUI_SCREEN_WIDTH" in msg


def _sections(cls: type) -> list[type]:
    out = [cls]
    for f in msgspec.structs.fields(cls):
        if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct):
            out.extend(_sections(f.type))
    return out


def test_every_field_documented() -> None:
    for cls in _sections(GuirlConfig):
        docs = field_docstrings(cls)
        assert set(docs) == set(cls.__struct_fields__), cls
        assert all(docs.values()), (cls, [k for k, v in docs.items() if not v])
    leaves = describe()
    assert len(leaves) > 40
    assert all(d.doc for d in leaves)


def test_describe_reports_env_secret_type_default() -> None:
    by_path = {d.path: d for d in describe()}
    assert by_path["wandb.key"].env == "WANDB_KEY" and by_path["wandb.key"].secret
    assert by_path["runtime.heartbeat_interval_s"].type == "float > 0"
    assert by_path["runtime.heartbeat_interval_s"].default == 1.0
    assert by_path["recorder.directions"].default == ["in", "out"]
    assert not by_path["wandb.project"].secret


def test_env_and_secret_tables_name_real_fields() -> None:
    paths = {d.path for d in describe()}
    assert set(ENV_VARS.values()) <= paths
    assert paths >= SECRET_KEYS
    assert len(set(ENV_VARS.values())) == len(ENV_VARS)  # one variable per field


def test_to_toml_round_trip(tmp_path: Path) -> None:
    cfg = load_config(
        env={"WANDB_KEY": "k-1", "VOLC_SECRETKEY": "s"},
        overrides=[
            'run.name="quote\\" back\\\\ nl\\n tab\\t del\\u007f ü"',
            "runtime.request_timeout_s=1e-3",
            'recorder.directions=["out"]',
            "recorder.enabled=true",
            "run.seed=123456789012",
        ],
    )
    assert cfg.run.name == 'quote" back\\ nl\n tab\t del\x7f ü'
    path = write(tmp_path, to_toml(cfg, redact_secrets=False))
    assert load_config(path, env={}) == cfg


def test_to_toml_redacts_only_set_secrets() -> None:
    text = to_toml(load_config(env={"VOLC_ACCESSKEY": "AKIAXYZ"}))
    assert "AKIAXYZ" not in text
    data = tomllib.loads(text)
    assert data["cloud"]["volcengine"]["access_key"] == "***"
    assert data["cloud"]["volcengine"]["secret_key"] == ""  # unset secrets stay visibly empty


def test_save_resolved_redacts_secrets(tmp_path: Path) -> None:
    cfg = load_config(env={"WANDB_KEY": "wandb-secret-123", "WANDB_PROJECT": "proj"})
    saved = save_resolved(cfg, tmp_path)
    assert saved == tmp_path / "config.toml"
    text = saved.read_text()
    assert "wandb-secret-123" not in text
    assert 'project = "proj"' in text
    assert load_config(saved, env={}).wandb.key == ""  # a redacted secret is never read back as a value
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]  # no temporary left behind


def test_save_resolved_replaces_previous(tmp_path: Path) -> None:
    save_resolved(load_config(env={}, overrides=["run.seed=1"]), tmp_path)
    saved = save_resolved(load_config(env={}, overrides=["run.seed=2"]), tmp_path)
    assert load_config(saved, env={}).run.seed == 2


def test_make_run_dir_creates_distinct_dirs(tmp_path: Path) -> None:
    cfg = load_config(env={"GUI_RESULT_DIR": str(tmp_path / "runs")}, overrides=["run.name=exp"])
    dirs = {make_run_dir(cfg) for _ in range(5)}
    assert len(dirs) == 5
    for d in dirs:
        assert d.is_dir() and d.parent == tmp_path / "runs"
        assert re.fullmatch(r"exp-\d{8}-\d{6}-[0-9a-f]{4}", d.name)


def test_vms_are_shared_out_over_workers():
    from guirl.placement import vm_split

    assert vm_split(64, 8) == [8] * 8  # GUI_POOL_MAX_ENVS=64 over 8 workers
    assert vm_split(5, 2) == [3, 2]
    assert vm_split(1, 3) == [1, 1, 1]  # every worker gets a VM
    assert vm_split(64, 2, per_worker=4) == [4, 4]


def test_a_saved_config_loads_back_without_its_redacted_secrets(tmp_path):
    from guirl.config import load_config, save_resolved

    cfg = load_config(env={"WANDB_KEY": "sekret", "WANDB_PROJECT": "p"})
    path = save_resolved(cfg, tmp_path)
    assert "sekret" not in path.read_text()
    again = load_config(path, env={})
    assert again.wandb.key == "" and again.wandb.project == "p"  # never the literal "***"
    assert load_config(path, env={"WANDB_KEY": "fresh"}).wandb.key == "fresh"


def test_wandb_settings_from_env_and_set() -> None:
    cfg = load_config(env={})
    assert (cfg.wandb.mode, cfg.wandb.entity, cfg.wandb.name, cfg.wandb.tags) == ("auto", "", "", [])
    cfg = load_config(
        env={"WANDB_MODE": "offline", "WANDB_ENTITY": "gui-team", "WANDB_PROJECT": "p"},
        overrides=['wandb.tags=["grpo", "local"]', "wandb.name=exp-1"],
    )
    assert cfg.wandb.mode == "offline" and cfg.wandb.entity == "gui-team" and cfg.wandb.project == "p"
    assert cfg.wandb.tags == ["grpo", "local"] and cfg.wandb.name == "exp-1"
    by_path = {d.path: d for d in describe()}
    assert by_path["wandb.mode"].env == "WANDB_MODE" and not by_path["wandb.mode"].secret
    assert by_path["wandb.entity"].env == "WANDB_ENTITY"
    assert by_path["wandb.mode"].type == "'auto' | 'online' | 'offline' | 'disabled' | 'dryrun' | 'run'"


def test_bad_wandb_mode_names_the_variable() -> None:
    assert error_message(env={"WANDB_MODE": "shared"}) == (
        "wandb.mode: expected one of 'auto', 'online', 'offline', 'disabled', 'dryrun', 'run', got 'shared' "
        "(from env WANDB_MODE)"
    )
    msg = error_message(env={}, overrides=["wandb.tags=3"])
    assert msg.startswith("wandb.tags: expected a list") and "--set" in msg


def test_wandb_settings_round_trip_with_the_key_redacted(tmp_path: Path) -> None:
    cfg = load_config(env={"WANDB_KEY": "k-9", "WANDB_MODE": "online"}, overrides=['wandb.tags=["a b"]'])
    saved = save_resolved(cfg, tmp_path)
    assert "k-9" not in saved.read_text()
    again = load_config(saved, env={"WANDB_KEY": "k-9"})
    assert again == cfg


def test_sections_with_secrets_never_show_them_in_their_repr() -> None:
    from guirl.config.schema import AliyunConfig, OpenAIBackendConfig, VolcengineConfig, WandbConfig

    sections = [
        VolcengineConfig(access_key="AKVOLC1", secret_key="SKVOLC2"),
        AliyunConfig(access_key_id="AKALI3", access_key_secret="SKALI4"),
        OpenAIBackendConfig(api_key="sk-OPENAI5"),
        WandbConfig(key="WANDB6"),
    ]
    text = repr(sections) + repr(GuirlConfig())
    for secret in ("AKVOLC1", "SKVOLC2", "AKALI3", "SKALI4", "sk-OPENAI5", "WANDB6"):
        assert secret not in text
    assert "secret_key='***'" in repr(sections[0]) and "api_key=''" in repr(OpenAIBackendConfig())
