"""Configs: every shipped file loads; every mistake names the file and the field."""

from pathlib import Path

import pytest

from gembench.errors import UsageError
from gembench.models.config import known_configs, load_config

GOOD = """
name = "mine"
kind = "gem"
description = "a user's own config"
[data]
global_batch = 8
[sparse]
dim = 8
rows = [100, 50]
pooling = [2, 1]
[dense]
mlp = [16, 8]
[[sequences]]
name = "s"
rows = 100
max_len = 8
mean_len = 4
[hstu]
layers = 1
dim = 8
heads = 2
[cross]
[wukong]
layers = 1
n_fm = 2
n_lcb = 2
rank = 2
mlp = [8]
[over]
mlp = [8]
tasks = 2
"""


def test_every_shipped_config_loads():
    names = known_configs()
    assert {"tiny", "small", "medium", "large", "xl", "dlrm", "dcnv2"} <= set(names)
    hashes = {load_config(n).hash for n in names}
    assert len(hashes) == len(names)  # configs differ, so do their hashes


def test_user_file_by_path(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(GOOD)
    cfg = load_config(path)
    assert cfg.name == "mine" and cfg.sparse.rows == (100, 50) and cfg.sequences[0].mean_len == 4
    # the hash follows content, not location
    other = tmp_path / "copy.toml"
    other.write_text(GOOD)
    assert load_config(other).hash == cfg.hash


def test_unknown_config_lists_known():
    with pytest.raises(UsageError, match="unknown config 'nope'.*tiny"):
        load_config("nope")


@pytest.mark.parametrize(
    "edit, message",
    [
        (("global_batch = 8\n", ""), "missing field 'data.global_batch'"),
        (("global_batch = 8", "global_batch = 8\nbatchsize = 3"), "unknown field 'data.batchsize'"),
        (("global_batch = 8", 'global_batch = "8"'), "'data.global_batch' must be int"),
        (("rows = [100, 50]", "rows = []"), "'sparse.rows' must list at least one table"),
        (("mean_len = 4", "mean_len = 9"), r"'sequences\[0\].mean_len' must be in 1..max_len"),
        (("dim = 8\nrows", "dim = -8\nrows"), "'sparse.dim' must be positive"),
        (("heads = 2", "heads = 3"), "'hstu.dim' must be divisible"),
        (("pooling = [2, 1]", "pooling = [2]"), "'sparse.pooling' must have one entry per table"),
        (
            ("global_batch = 8", "global_batch = 8\nzipf = [1.1]"),
            r"'data.zipf' must have one exponent per pooled table \(2\)",
        ),
        (("global_batch = 8", "global_batch = 8\nzipf = [1.1, -1.0]"), "'data.zipf' must all be >= 0"),
        (
            ("global_batch = 8", 'global_batch = 8\npooling_kinds = ["fixed", "poisson"]'),
            "'data.pooling_kinds' must each be",
        ),
        (("global_batch = 8", 'global_batch = 8\nid_layout = "random"'), "'data.id_layout' must be hashed or sorted"),
    ],
)
def test_bad_field_names_file_and_field(tmp_path, edit, message):
    path = tmp_path / "bad.toml"
    old, new = edit
    assert old in GOOD
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(UsageError, match=message) as err:
        load_config(path)
    assert str(path) in str(err.value)


def test_not_toml(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[data\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_config(path)


def test_batch_override_changes_global_batch_and_hash():
    from gembench.models.config import with_global_batch

    cfg = load_config("tiny")
    assert with_global_batch(cfg, None) is cfg
    other = with_global_batch(cfg, 128, nproc=2)
    assert other.data.global_batch == 128 and other.hash != cfg.hash
    assert with_global_batch(cfg, cfg.data.global_batch).hash == cfg.hash  # same batch, same config


@pytest.mark.parametrize(
    "batch, nproc, message",
    [
        (0, 1, "--batch must be a positive"),
        (-8, 1, "--batch must be a positive"),
        (63, 2, "--batch 63 does not split evenly over --nproc 2"),
    ],
)
def test_bad_batch_is_a_usage_error(batch, nproc, message):
    from gembench.models.config import with_global_batch

    with pytest.raises(UsageError, match=message):
        with_global_batch(load_config("tiny"), batch, nproc)


def test_per_table_distributions_count_in_the_hash_only_when_set(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    base = load_config(path)
    path.write_text(GOOD.replace("global_batch = 8", 'global_batch = 8\nid_layout = "hashed"\nzipf = []'))
    assert load_config(path).hash == base.hash  # the defaults, written out
    path.write_text(GOOD.replace("global_batch = 8", 'global_batch = 8\nid_layout = "sorted"\nzipf = [0.9, 1.3]'))
    changed = load_config(path)
    assert changed.hash != base.hash and changed.data.zipf == (0.9, 1.3)


def test_the_committed_baselines_config_hashes_are_still_the_configs():
    """A field added to the config dataclasses changes every config's hash unless it is hashed only
    when set (config.HASHED_WHEN_SET): then every committed baseline and every recorded result
    would stop comparing with new runs. The committed baselines pin the hashes."""
    import glob
    import json

    paths = glob.glob(str(Path(load_config("tiny").source).parents[2] / "results" / "baselines" / "*" / "*.json"))
    assert paths, "no committed baseline to pin a config hash with"
    for path in paths:
        doc = json.loads(Path(path).read_text())
        for run in doc["runs"]:
            cfg = load_config(run["config"]["name"])
            if run["run"]["global_batch"] == cfg.data.global_batch:
                assert cfg.hash == run["config"]["hash"], f"{path}: {cfg.name}'s hash changed"
