"""One typed config tree: defaults < TOML file < GUI-RL's environment variables < `--set` overrides."""

from guirl.config.loader import (
    ConfigError,
    FieldDoc,
    describe,
    field_docstrings,
    load_config,
    make_run_dir,
    save_resolved,
    to_toml,
)
from guirl.config.schema import *
from guirl.config.schema import ENV_VARS, REDACTED, SECRET_KEYS, GuirlConfig

__all__ = [
    "ENV_VARS",
    "REDACTED",
    "SECRET_KEYS",
    "ConfigError",
    "FieldDoc",
    "GuirlConfig",
    "describe",
    "field_docstrings",
    "load_config",
    "make_run_dir",
    "save_resolved",
    "to_toml",
]
