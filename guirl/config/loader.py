"""Loading, explaining and saving the config tree (defaults < TOML < environment < `--set`).

Every field carries a one-line attribute docstring (the string literal on the line after it);
``describe`` reads them back with ``ast`` so the documentation cannot drift from the code.
To add a setting: add a field (with its docstring) to a section, and, if OpenClaw-RL's GUI-RL scripts
set it through the environment, add the variable to ``ENV_VARS`` (and to ``SECRET_KEYS`` if secret).
"""

import ast
import difflib
import functools
import inspect
import logging
import os
import secrets
import tempfile
import textwrap
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec

from guirl.config.schema import ENV_VARS, REDACTED, SECRET_KEYS, GuirlConfig

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration value, key or file is invalid; the message names the key and its source."""


class FieldDoc(msgspec.Struct, frozen=True):
    """Documentation of one leaf setting, as extracted by ``describe``."""

    path: str
    type: str
    default: Any
    doc: str
    env: str | None
    secret: bool


# --------------------------------------------------------------------------- introspection


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _fields(cls: type) -> dict[str, msgspec.structs.FieldInfo]:
    return {f.name: f for f in msgspec.structs.fields(cls)}


@functools.cache
def field_docstrings(cls: type) -> dict[str, str]:
    """Map each annotated field of ``cls`` to the string literal on the line after it ("" if none)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, nxt in zip(body, [*body[1:], None], strict=True):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            is_doc = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
            text = nxt.value.value if is_doc else ""  # type: ignore[union-attr]
            docs[stmt.target.id] = text.strip() if isinstance(text, str) else ""
    return docs


def _type_name(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        meta = args[1]
        bounds = [f"{op} {v}" for op, v in ((">", meta.gt), (">=", meta.ge)) if v is not None]
        return " ".join([_type_name(args[0]), *bounds])
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp))


def _default(f: msgspec.structs.FieldInfo) -> Any:
    return f.default_factory() if f.default is msgspec.NODEFAULT else f.default


def describe(cls: type = GuirlConfig, prefix: str = "") -> list[FieldDoc]:
    """Every leaf setting under ``cls``: dotted path, type, default, docstring, env var, secret flag."""
    env_of = {path: name for name, path in ENV_VARS.items()}
    docs = field_docstrings(cls)
    out: list[FieldDoc] = []
    for name, f in _fields(cls).items():
        path = f"{prefix}{name}"
        if _is_section(f.type):
            out.extend(describe(f.type, f"{path}."))
        else:
            out.append(
                FieldDoc(
                    path,
                    _type_name(f.type),
                    _default(f),
                    docs.get(name, ""),
                    env_of.get(path),
                    path in SECRET_KEYS,
                )
            )
    return out


def _leaf_type(path: str) -> Any:
    """Type of the field at a valid dotted leaf path."""
    cls: Any = GuirlConfig
    for part in path.split("."):
        cls = _fields(cls)[part].type
    return cls


# --------------------------------------------------------------------------- loading

_Layer = dict[str, tuple[Any, str]]  # dotted leaf path -> (value, source)

RENAMED_KEYS = {
    "eval.fault_kill_vm_at_step": "faults.kill_vm_at_step",
    "train.fault_kill_prm_at_version": "faults.kill_prm_at_version",
    "train.fault_kill_learner_at_version": "faults.kill_learner_at_version",
    "eval.workers": "env.workers",
    "eval.vms_per_worker": "env.vms_per_worker",
}
"""Keys that moved: an old name (in a run directory's saved `config.toml`, a user's file or `--set`) is
read as its new one, with a warning saying so."""


def _flatten(data: Mapping[str, Any], source: str, cls: type, prefix: str, out: _Layer) -> None:
    """Add ``data``'s leaves to ``out``, rejecting keys that are not in ``cls``'s tree."""
    fields = _fields(cls)
    for key, value in data.items():
        path = f"{prefix}{key}"
        if path in RENAMED_KEYS:
            new = RENAMED_KEYS[path]
            if new in out and out[new][1] == source:
                raise ConfigError(
                    f"{path} and {new} are one setting, given twice (from {source}): keep {new}"
                )
            log.warning("%s is now %s (from %s)", path, new, source)
            out[new] = (value, f"{source}, as {path}")
            continue
        if key not in fields:
            raise ConfigError(f"unknown key {path!r} (from {source}){_did_you_mean(key, fields, prefix)}")
        if path in out and out[path][1].startswith(f"{source}, as "):
            old = out[path][1].removeprefix(f"{source}, as ")
            raise ConfigError(f"{old} and {path} are one setting, given twice (from {source}): keep {path}")
        tp = fields[key].type
        if _is_section(tp):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{path}: expected a table, got {value!r} (from {source})")
            _flatten(value, source, tp, f"{path}.", out)
        elif isinstance(value, Mapping) and value and get_origin(tp) is not dict:
            # A table under a leaf (`run.name.x = 1`) is a misspelt key, not a wrong value.
            raise ConfigError(f"unknown key {f'{path}.{next(iter(value))}'!r} (from {source})")
        else:
            out[path] = (value, source)


def shipped_configs() -> list[str]:
    """The names of the configs guirl ships (`configs/*.toml` of its tree), for `--config NAME`."""
    return sorted(p.stem for p in (SOURCE_TREE / "configs").glob("*.toml"))


def config_file(path: str | Path) -> Path:
    """`--config`'s file: a path, or the name of a shipped config (`local_eval`, `osworld_qwen3vl_8b_rl`)
    when no such file is here, so the commands of the README work from any directory."""
    given = Path(path).expanduser()
    if given.exists() or "/" in str(path):
        return given
    shipped = SOURCE_TREE / "configs" / (given.name if given.suffix == ".toml" else f"{given.name}.toml")
    if shipped.is_file():
        return shipped
    names = shipped_configs()
    close = difflib.get_close_matches(given.stem, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f" (shipped: {', '.join(names)})" if names else ""
    raise ConfigError(f"cannot read config file {str(path)!r}: no such file, nor a shipped config{hint}")


def _did_you_mean(key: str, fields: Mapping[str, Any], prefix: str) -> str:
    """ "; did you mean 'train.lr'?" for the closest key of the section `key` was given in, "" if none is."""
    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
    return f"; did you mean {prefix + close[0]!r}?" if close else ""


def _from_toml_file(path: Path) -> _Layer:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from exc
    layer: _Layer = {}
    _flatten(data, str(path), GuirlConfig, "", layer)
    return layer


def _from_env(env: Mapping[str, str]) -> _Layer:
    layer: _Layer = {}
    for name, path in ENV_VARS.items():
        if name not in env:
            continue
        raw, source = env[name], f"env {name}"
        # Environment values are strings; convert to the field's type here so errors name the variable.
        try:
            value = msgspec.convert(raw, _leaf_type(path), strict=False)
        except msgspec.ValidationError as exc:
            raise ConfigError(_explain(path, raw, source, str(exc))) from None
        layer[path] = (value, source)
    return layer


def _from_overrides(overrides: Sequence[str]) -> _Layer:
    layer: _Layer = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"malformed override {item!r}: expected key=value (from --set)")
        try:
            value = tomllib.loads("v = " + text)["v"]
        except tomllib.TOMLDecodeError:
            value = text
        nested: dict[str, Any] = {}
        parts = key.split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
        _flatten(nested, "--set", GuirlConfig, "", layer)
        # `--set model.hf_ckpt=123` means the string "123", not an int: keep the raw text for str fields.
        if key in layer and _leaf_type(key) is str and not isinstance(value, str):
            layer[key] = (text, "--set")
    return layer


_TYPE_WORDS = {
    "`float`": "a number",
    "`int`": "an integer",
    "`str`": "a string",
    "`bool`": "a boolean",
    "`array`": "a list",
    "`object`": "a table",
}


def _explain(path: str, value: Any, source: str, msgspec_message: str) -> str:
    """Turn msgspec's 'Expected `float` > 0.0 - at `$.x`' into 'path: expected a number > 0.0, got …'."""
    detail = msgspec_message.split(" - at `", 1)[0]
    if detail.startswith("Invalid enum value"):
        tp = _leaf_type(path)
        while get_origin(tp) in (list, Annotated):
            tp = get_args(tp)[0]
        detail = "expected one of " + ", ".join(repr(a) for a in get_args(tp))
    else:
        detail = detail.split(", got ", 1)[0]
        for word, plain in _TYPE_WORDS.items():
            detail = detail.replace(word, plain)
        detail = detail[:1].lower() + detail[1:]
    return f"{path}: {detail}, got {value!r} (from {source})"


PATH_KEYS = (
    "eval.tasks",
    "eval.examples_dir",
    "train.tasks",
    "inference.scripted.dir",
    "env.replay.run",
    "data.train",
    "data.eval",
    "sft.data",
    "sft.run_dirs",
    "prm.template",
    "model.hf_ckpt",
    "model.prm_model_path",
    "env.google_drive_settings",
    "env.google_account",
    "runtime.curve_keys_dir",
    "recorder.dir",
)
"""Settings naming files or directories on this host: a relative one is taken from the directory of the
config file that sets it, from the working directory when the environment or `--set` does, and from
guirl's own tree (its shipped `tasks/`) for a default; each is made absolute, so a run's saved
`config.toml` means the same from anywhere. `run.root_dir` is not among them: a run's output goes under
the working directory, as GUI-RL's `GUI_RESULT_DIR` does."""
_MODEL_KEYS = ("model.hf_ckpt", "model.prm_model_path")
RUN_MARKS = ("episodes.jsonl", "status.json", "summary.json", "coordinator.json")
"""Files only a run directory holds: a config.toml beside them is a run's saved configuration."""
SOURCE_TREE = Path(__file__).resolve().parents[2]
"""The tree guirl runs from: a checkout (or an editable install) has its `tasks/` and `configs/` there."""


def _resolve_paths(layer: _Layer, from_file: _Layer, file_dir: Path | None) -> None:
    """Make the relative values of `PATH_KEYS` in `layer` absolute (see there), defaults included."""
    defaults = {f.path: f.default for f in describe() if f.path in PATH_KEYS}
    shipped = SOURCE_TREE if (SOURCE_TREE / "tasks").is_dir() else Path.cwd()
    if file_dir is not None and any((file_dir / n).exists() for n in RUN_MARKS):
        # a run's own saved config (`--resume`): guirl saves its paths absolute, so a relative one was saved
        # by an earlier guirl, relative to the directory that run was started from
        file_dir = Path.cwd()
    for key in PATH_KEYS:
        if key not in layer:
            value, source, base = defaults[key], "default", shipped
        else:
            value, source = layer[key]
            in_file = key in from_file and from_file[key][1] == source and file_dir is not None
            base = file_dir if in_file else Path.cwd()  # type: ignore[assignment]
        if isinstance(value, list):
            resolved: Any = [_resolved(key, v, base) if isinstance(v, str) else v for v in value]
        else:
            resolved = _resolved(key, value, base) if isinstance(value, str) else value
        if resolved != value or key in layer:
            layer[key] = (resolved, source)


def _resolved(key: str, value: str, base: Path) -> str:
    if not value or value == "tiny" or value.startswith("synth:"):
        return value  # none, the tiny model, generated rows
    if key == "prm.template" and not value.endswith(".toml"):
        return value  # a built-in template's name
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    candidate = Path(os.path.normpath(base / path))
    if key in _MODEL_KEYS and not candidate.exists() and not value.startswith("."):
        return value  # a Hugging Face id (`Qwen/Qwen3-VL-4B-Instruct`), looked up in the local cache
    return str(candidate)


def _unflatten(layer: _Layer) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path, (value, _) in layer.items():
        *parents, leaf = path.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def load_config(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Sequence[str] = (),
    mode: str | None = None,
) -> GuirlConfig:
    """Resolve the config: defaults < TOML file at ``path`` < ``env`` (default os.environ) < overrides,
    then check the rules between fields (`guirl.config.validate`; with ``mode``, "eval" or "train", also
    what a run of that mode needs).

    ``overrides`` are ``dotted.key=value`` strings (the CLI's ``--set``); a value that parses as a TOML
    value is used as one (``3``, ``true``, ``["in"]``), anything else as a plain string.
    """
    layer: _Layer = {}
    from_file: _Layer = {}
    if path is not None:
        path = config_file(path)
        from_file = _from_toml_file(path)
        # a saved (resolved) config has its secrets redacted: "***" is no key; the environment brings it
        layer.update({k: v for k, v in from_file.items() if not (k in SECRET_KEYS and v[0] == REDACTED)})
    layer.update(_from_env(os.environ if env is None else env))
    layer.update(_from_overrides(overrides))
    _resolve_paths(layer, from_file, Path(path).resolve().parent if path is not None else None)
    try:
        cfg = msgspec.convert(_unflatten(layer), GuirlConfig)
    except msgspec.ValidationError as exc:
        message = str(exc)
        at = message.rsplit(" - at `$.", 1)[-1].rstrip("`") if " - at `$." in message else ""
        key = at.split("[", 1)[0]
        value, source = layer.get(key, (None, "unknown source"))
        raise ConfigError(_explain(key, value, source, message)) from None
    from guirl.config.validate import validate

    validate(cfg, mode)
    return cfg


# --------------------------------------------------------------------------- saving


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # repr gives 1.0, 1e+20, inf, nan: all valid TOML
    if isinstance(value, str):
        escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
        body = "".join(
            escapes.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c) for c in value
        )
        return f'"{body}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _toml_table(section: msgspec.Struct, prefix: str, redact: bool, lines: list[str]) -> None:
    leaves, tables = [], []
    for name in section.__struct_fields__:
        value = getattr(section, name)
        (tables if isinstance(value, msgspec.Struct) else leaves).append((name, value))
    if leaves and prefix:
        lines.extend(["", f"[{prefix}]"])
    for name, value in leaves:
        hidden = redact and value and f"{prefix}.{name}".lstrip(".") in SECRET_KEYS
        lines.append(f"{name} = {_toml_value(REDACTED if hidden else value)}")
    for name, value in tables:
        _toml_table(value, f"{prefix}.{name}".lstrip("."), redact, lines)


def to_toml(cfg: GuirlConfig, *, redact_secrets: bool = True) -> str:
    """The config as TOML; set secrets are written as "***" unless ``redact_secrets`` is False."""
    lines: list[str] = []
    _toml_table(cfg, "", redact_secrets, lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def save_resolved(cfg: GuirlConfig, run_dir: str | Path) -> Path:
    """Atomically write the resolved config, secrets redacted, to ``<run_dir>/config.toml``."""
    target = Path(run_dir) / "config.toml"
    fd, tmp = tempfile.mkstemp(prefix=".config.toml.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(to_toml(cfg, redact_secrets=True))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def make_run_dir(cfg: GuirlConfig) -> Path:
    """Create and return a fresh ``<root_dir>/<name>-<YYYYmmdd-HHMMSS>-<4 hex>`` (UTC time)."""
    root = Path(cfg.run.root_dir)
    root.mkdir(parents=True, exist_ok=True)
    while True:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        candidate = root / f"{cfg.run.name}-{stamp}-{secrets.token_hex(2)}"
        try:
            candidate.mkdir()  # exist_ok=False: never reuse a directory
        except FileExistsError:
            continue
        return candidate
