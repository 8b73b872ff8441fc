"""Load results/thresholds.toml and resolve the limits for one config on one hardware class.

Layers, later ones win: [defaults], [config."<name>"], [hardware."<class>"] and
[hardware."<class>".config."<name>"]. Hardware class keys may be shell patterns ("cpu-*"),
applied in file order. Every mistake names the file, the table and the field.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from gembench.errors import UsageError
from gembench.harness.regression.directions import COUNTERS, GENERAL_COUNTER_LIMIT, INSTRUCTIONS_LIMIT, info

DEFAULT_PATH = Path("results/thresholds.toml")

# field -> (lowest allowed, highest allowed, what it is)
FIELDS: dict[str, tuple[float, float, str]] = {
    "min_mfu": (0.0, 1.0, "lowest acceptable MFU, a fraction (0.2 = 20%)"),
    "min_ab_mfu_ratio": (0.0, 1e6, "lowest acceptable optimized/naive MFU ratio (2.0 = the doubling)"),
    "max_imbalance": (1.0, 1e6, "highest acceptable embedding imbalance, max/mean over ranks (>= 1)"),
    "max_exposed_comm": (0.0, 1.0, "highest acceptable exposed-communication share of the step, a fraction"),
    "max_startup_s": (0.0, 1e6, "longest acceptable time to the first timed step, seconds (start-up)"),
    "alpha": (1e-9, 0.4999, "false-alarm rate of the regression tests against the baseline"),
    "min_effect": (0.0, 0.9999, "smallest relative change against the baseline that counts (0.03 = 3%)"),
}
# Cost counters (directions.COUNTERS) and instruction counts: the largest increase that is not a
# regression, a fraction of the reference count (0 = any increase fails, 0.01 = 1%). No statistics:
# the counts are exact. A per-counter field beats max_counter_increase.
COUNTER_FIELDS: dict[str, tuple[float, float, str]] = {
    GENERAL_COUNTER_LIMIT: (0.0, 1e6, "largest allowed increase of any cost counter, a fraction (0 = none)"),
    **{
        f"max_{c}_increase": (0.0, 1e6, f"largest allowed increase of the {c} counter, a fraction (0 = none)")
        for c in COUNTERS
    },
    INSTRUCTIONS_LIMIT: (0.0, 1e6, "largest allowed increase of a kernel's instruction count, a fraction (0.01 = 1%)"),
}
FIELDS.update(COUNTER_FIELDS)


@dataclass
class Limits:
    """Resolved limits; None means "not checked". ``sources`` says which table set each field."""

    min_mfu: float | None = None
    min_ab_mfu_ratio: float | None = None
    max_imbalance: float | None = None
    max_exposed_comm: float | None = None
    max_startup_s: float | None = None
    alpha: float | None = None
    min_effect: float | None = None
    sources: dict | None = None
    counters: dict = field(default_factory=dict)  # COUNTER_FIELDS name -> fraction, where set

    def counter_limit(self, metric: str) -> tuple[float, str]:
        """(allowed increase as a fraction, where it was set) for a counter metric."""
        meta = info(metric)
        keys = [meta.limit] if meta and meta.limit else []
        if meta and meta.limit != INSTRUCTIONS_LIMIT:
            keys.append(GENERAL_COUNTER_LIMIT)
        for key in keys:
            if key in self.counters:
                return self.counters[key], f"{key} from {(self.sources or {}).get(key, '?')}"
        return (meta.default_increase if meta else 0.0), "default"


def _check_table(path: Path, where: str, table) -> dict:
    if not isinstance(table, dict):
        raise UsageError(f"{path}: {where} must be a table, got {type(table).__name__}")
    out = {}
    for key, value in table.items():
        if key in ("config",) and where.startswith("[hardware"):
            continue  # nested config tables are read separately
        if key not in FIELDS:
            raise UsageError(f"{path}: {where} field {key!r} is unknown; known fields: {', '.join(FIELDS)}")
        lo, hi, what = FIELDS[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{path}: {where} field {key!r} must be a number ({what}), got {value!r}")
        if not lo <= value <= hi:
            raise UsageError(f"{path}: {where} field {key!r} = {value} is out of range [{lo:g}, {hi:g}] ({what})")
        out[key] = float(value)
    return out


def load(path: str | Path, config: str, hardware_class: str) -> Limits:
    """Limits for ``config`` on ``hardware_class`` from the TOML file at ``path``."""
    from gembench.errors import read_toml

    path = Path(path)
    data = read_toml(path, f"no thresholds file {path}; pass --thresholds")
    unknown = set(data) - {"defaults", "config", "hardware"}
    if unknown:
        raise UsageError(
            f'{path}: unknown top-level table(s) {sorted(unknown)}; use [defaults], [config."NAME"], [hardware."CLASS"]'
        )
    layers: list[tuple[str, dict]] = []
    layers.append(("[defaults]", _check_table(path, "[defaults]", data.get("defaults", {}))))
    configs = data.get("config", {})
    if not isinstance(configs, dict):
        raise UsageError(f'{path}: [config] must hold tables like [config."tiny"]')
    for name, table in configs.items():
        checked = _check_table(path, f"[config.{name!r}]", table)
        if name == config:
            layers.append((f"[config.{name!r}]", checked))
    hardware = data.get("hardware", {})
    if not isinstance(hardware, dict):
        raise UsageError(f'{path}: [hardware] must hold tables like [hardware."cpu"]')
    for pattern, table in hardware.items():
        where = f"[hardware.{pattern!r}]"
        checked = _check_table(path, where, table)
        nested = table.get("config", {}) if isinstance(table, dict) else {}
        if not isinstance(nested, dict):
            raise UsageError(
                f'{path}: {where} field \'config\' must hold tables like [hardware."{pattern}".config."tiny"]'
            )
        nested_checked = {n: _check_table(path, f"[hardware.{pattern!r}.config.{n!r}]", t) for n, t in nested.items()}
        if fnmatch.fnmatchcase(hardware_class, pattern):
            layers.append((where, checked))
            if config in nested_checked:
                layers.append((f"[hardware.{pattern!r}.config.{config!r}]", nested_checked[config]))
    limits = Limits(sources={})
    for where, values in layers:
        for key, value in values.items():
            if key in COUNTER_FIELDS:
                limits.counters[key] = value
            else:
                setattr(limits, key, value)
            limits.sources[key] = where
    return limits
