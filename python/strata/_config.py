"""A strata Config from what a PyTorch user passes: a TOML file's path, a dict shaped like the
TOML (sections as nested dicts), or None (every default), plus keyword overrides of [optimizer].
Bad TOML raises strata.ConfigError (a ValueError) with strata's message: file, line, key."""

import math
import os
from collections.abc import Mapping

from strata import _strata


def engine_config(config, *, lr=None, betas=None, eps=None, weight_decay=None, grad_clip=None):
    """The validated Config for an Engine on the host device, overrides applied."""
    cfg = _read(config)
    if cfg.device_kind == _strata.DeviceKind.cuda:
        raise ValueError(
            f'{cfg.source}: [tiers.device] kind = "cuda": strata.torch runs the Engine on the '
            'host device (torch keeps the GPU); use "host" or "auto"')
    cfg.device_kind = _strata.DeviceKind.host
    optimizer = cfg.optimizer
    if lr is not None:
        optimizer.lr = _checked("lr", lr, low=0.0)
    if betas is not None:
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"invalid betas {betas!r}: must be two numbers (beta1, beta2)")
        beta1, beta2 = betas
        optimizer.beta1 = _checked("betas[0]", beta1, low=0.0, below=1.0)
        optimizer.beta2 = _checked("betas[1]", beta2, low=0.0, below=1.0)
    if eps is not None:
        optimizer.eps = _checked("eps", eps, low=0.0)
    if weight_decay is not None:
        optimizer.weight_decay = _checked("weight_decay", weight_decay, low=0.0)
    if grad_clip is not None:
        optimizer.grad_clip = _checked("grad_clip", grad_clip, low=0.0)
    return cfg


def _read(config):
    if config is None:
        return _strata.parse_config("", "<defaults>")
    if isinstance(config, (str, os.PathLike)):
        return _strata.load_config(os.fspath(config))
    if isinstance(config, Mapping):
        return _strata.parse_config(to_toml(config), "<dict>")
    raise TypeError("config must be a TOML file's path, a dict or None, not "
                    f"{type(config).__name__}")


def _checked(name, value, low, below=None):
    value = float(value)
    if not math.isfinite(value) or value < low or (below is not None and value >= below):
        allowed = f"in [{low}, {below})" if below is not None else f">= {low}"
        raise ValueError(f"invalid {name} {value}: must be finite and {allowed}")
    return value


def to_toml(config, _prefix=""):
    """TOML text for a dict: scalars first, then each nested dict as a [section]."""
    lines = []
    tables = []
    for key, value in config.items():
        if not isinstance(key, str):
            raise TypeError(f"config key {_prefix}{key!r} is not a string")
        if isinstance(value, Mapping):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value, _prefix + key)}")
    for key, table in tables:
        name = _prefix + key
        lines.append(f"[{name}]")
        lines.append(to_toml(table, name + "."))
    return "\n".join(lines)


def _toml_value(value, where):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else
                                                          ("inf" if value > 0 else "-inf"))
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item, where) for item in value) + "]"
    raise TypeError(f"config value {where} = {value!r}: TOML has no {type(value).__name__}")
