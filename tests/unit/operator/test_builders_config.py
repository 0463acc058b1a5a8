"""OperatorConfig.from_env: the settings the chart hands the operator, and the errors for bad ones."""

from __future__ import annotations

import pytest

from ringseed.operator import config


def test_defaults_without_environment() -> None:
    cfg = config.OperatorConfig.from_env({})
    assert cfg == config.OperatorConfig()
    assert (cfg.data_root, cfg.models_root) == ("/var/lib/ringseed", "/var/lib/ringseed/models")
    assert cfg.image.startswith("ghcr.io/ringseed/ringseed:")


def test_every_variable_is_read() -> None:
    cfg = config.OperatorConfig.from_env(
        {
            "RINGSEED_IMAGE": "reg/ringseed:9",
            "RINGSEED_IMAGE_PULL_POLICY": "Always",
            "RINGSEED_IMAGE_PULL_SECRETS": "a, b,",
            "RINGSEED_DATA_ROOT": "/srv/rs/",
            "RINGSEED_MASTER_RESOURCES": '{"requests": {"cpu": "1"}}',
            "RINGSEED_AGENT_RESOURCES": '{"limits": {"memory": "8Gi"}}',
            "RINGSEED_AGENT_MEMORY_BYTES": "2Gi",
            "RINGSEED_HEARTBEAT_SECONDS": "3",
            "RINGSEED_OFFLINE_AFTER_SECONDS": "30",
            "RINGSEED_STATUS_INTERVAL_SECONDS": "2.5",
            "RINGSEED_APPLY_CONCURRENCY": "4",
            "RINGSEED_SERVICE_ACCOUNT": "ringseed-workloads",
            "RINGSEED_WATCH_NAMESPACES": "ml,research",
        }
    )
    assert cfg == config.OperatorConfig(
        image="reg/ringseed:9",
        image_pull_policy="Always",
        image_pull_secrets=("a", "b"),
        data_root="/srv/rs",
        master_resources={"requests": {"cpu": "1"}},
        agent_resources={"limits": {"memory": "8Gi"}},
        agent_memory_bytes=2 << 30,
        heartbeat_seconds=3,
        offline_after_seconds=30,
        status_interval_seconds=2.5,
        apply_concurrency=4,
        service_account="ringseed-workloads",
        watch_namespaces=("ml", "research"),
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RINGSEED_IMAGE_PULL_POLICY", "Sometimes"),
        ("RINGSEED_DATA_ROOT", "relative"),
        ("RINGSEED_DATA_ROOT", "/"),
        ("RINGSEED_DATA_ROOT", "/var/../etc"),
        ("RINGSEED_MASTER_RESOURCES", "cpu=1"),
        ("RINGSEED_AGENT_RESOURCES", '{"cpu": "1"}'),
        ("RINGSEED_AGENT_MEMORY_BYTES", "lots"),
        ("RINGSEED_HEARTBEAT_SECONDS", "0"),
        ("RINGSEED_STATUS_INTERVAL_SECONDS", "-1"),
        ("RINGSEED_APPLY_CONCURRENCY", "0"),
    ],
)
def test_malformed_values_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ValueError, match=variable):
        config.OperatorConfig.from_env({variable: value})


def test_default_resources_are_not_shared_between_configs() -> None:
    one, two = config.OperatorConfig(), config.OperatorConfig()
    one.agent_resources["limits"]["memory"] = "1Ti"
    assert two.agent_resources["limits"]["memory"] == "4Gi"
