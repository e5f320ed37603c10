"""platforms.yaml parsing: good files load, bad ones fail naming file, key and reason."""

from pathlib import Path

import pytest

from gpupool.config import ConfigError, default_config, load_config

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "platforms.example.yaml"


def test_example_file_loads():
    cfg = load_config(EXAMPLE)
    hpc = cfg.platform("hpc")
    assert hpc.kind == "slurm"
    assert "partition" in hpc.metrics["gpu_pending"]
    assert all(p.actuation is False for p in cfg.platforms)  # actuation off unless said
    assert cfg.dry_run is True
    assert cfg.pool.nodes[0].name_on("cloud") == "compute-gpu-a01.dc1"
    assert cfg.pool.nodes[1].name_on("cloud") == "gpu-a02"


def test_embedded_default_is_three_simulated_platforms():
    cfg = default_config()
    assert [p.name for p in cfg.platforms] == ["openstack", "slurm", "kubernetes"]
    assert {p.kind for p in cfg.platforms} == {"simulator"}


@pytest.mark.parametrize(
    "body, key, reason",
    [
        ("platforms:\n  - {name: hpc, kind: lsf}\n", "platforms[hpc].kind", "Input should be"),
        ("platforms:\n  - {name: hpc, kind: slurm, min_nodes: -1}\n", "platforms[hpc].min_nodes", "greater than or equal"),
        ("platforms:\n  - {name: hpc, kind: slurm, colour: red}\n", "platforms[hpc].colour", "Extra inputs"),
        ("platforms:\n  - {name: a, kind: slurm, conn_id: p}\n  - {name: a, kind: kubernetes, conn_id: k}\n", "platforms", "unique"),
        ("platforms:\n  - {name: a, kind: slurm, min_nodes: 5, max_nodes: 2}\n", "platforms[a]", "max_nodes"),
        ("platforms: []\n", "platforms", "at least one platform"),
        ("limits: {max_moves_per_run: x}\nplatforms:\n  - {name: a, kind: slurm, conn_id: p}\n", "limits.max_moves_per_run", "integer"),
    ],
)
def test_bad_files_name_file_key_and_reason(tmp_path, body, key, reason):
    path = tmp_path / "platforms.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and f"'{key}'" in msg and reason in msg


def test_unreadable_and_non_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("platforms: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(scalar)
