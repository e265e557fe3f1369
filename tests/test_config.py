"""The typed configuration: defaults from the SPEC, YAML and environment overrides, and fail-fast errors."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sluice.config import ConfigError, load_settings, parse_duration, parse_timestamp


def test_spec_defaults() -> None:
    s = load_settings({}, home="/tmp/sluice-home")
    assert s.stream("impressions").watermark_delay == timedelta(minutes=10)
    assert s.stream("clicks").watermark_delay == timedelta(minutes=10)
    assert s.stream("events").watermark_delay == timedelta(minutes=5)
    for name in ("impressions", "clicks", "events"):
        assert s.stream(name).early_tolerance == timedelta(minutes=5)
        assert s.stream(name).idle_timeout == timedelta(minutes=30)
    assert s.landing.local() == Path("/tmp/sluice-home/landing")
    assert s.lake.local() == Path("/tmp/sluice-home/lake")
    assert s.lateness_threshold == 0.01
    assert s.now_override is None


def test_roots_and_now_are_injected(tmp_path: Path) -> None:
    env = {
        "SLUICE_HOME": str(tmp_path),
        "SLUICE_LAKE": str(tmp_path / "elsewhere"),
        "SLUICE_NOW": "2024-05-01T12:00:00+02:00",
    }
    s = load_settings(env)
    assert s.home == tmp_path and s.lake.local() == tmp_path / "elsewhere" and s.landing.local() == tmp_path / "landing"
    assert s.now() == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert load_settings(env, now="2024-05-02T00:00:00Z").now() == datetime(2024, 5, 2, tzinfo=UTC)


def test_yaml_then_environment_override(tmp_path: Path) -> None:
    config = tmp_path / "sluice.yaml"
    config.write_text(
        "streams:\n  clicks: {watermark_delay: 15m, idle_timeout: 1h}\n"
        "dedup_retention: 12h\npipelines:\n  ad_clicks_hourly: {window: {size: 1h, hop: 30m}}\n"
    )
    s = load_settings({"SLUICE_CONFIG": str(config), "SLUICE_CLICKS_IDLE_TIMEOUT": "45 min"})
    assert s.stream("clicks").watermark_delay == timedelta(minutes=15)
    assert s.stream("clicks").idle_timeout == timedelta(minutes=45)  # env beats YAML
    assert s.dedup_retention == timedelta(hours=12)
    assert s.windows["ad_clicks_hourly"] == (timedelta(hours=1), timedelta(minutes=30))
    # $SLUICE_HOME/sluice.yaml is picked up without SLUICE_CONFIG
    assert load_settings({}, home=tmp_path).stream("clicks").watermark_delay == timedelta(minutes=15)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"SLUICE_CLICKS_WATERMARK_DELAY": "soon"}, "SLUICE_CLICKS_WATERMARK_DELAY"),
        ({"SLUICE_EVENTS_IDLE_TIMEOUT": "-5m"}, "SLUICE_EVENTS_IDLE_TIMEOUT"),
        ({"SLUICE_MAX_FILES_PER_TRIGGER": "0"}, "SLUICE_MAX_FILES_PER_TRIGGER"),
        ({"SLUICE_LATENESS_THRESHOLD": "2"}, "SLUICE_LATENESS_THRESHOLD"),
        ({"SLUICE_NOW": "yesterday"}, "SLUICE_NOW"),
        ({"SLUICE_AD_CLICKS_HOURLY_WINDOW_SIZE": "0s"}, "SLUICE_AD_CLICKS_HOURLY_WINDOW_SIZE"),
    ],
)
def test_invalid_values_fail_fast_naming_the_key(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_settings(env)


def test_yaml_errors_name_the_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("streams:\n  clickz: {watermark_delay: 5m}\n")
    with pytest.raises(ConfigError, match=r"streams\.clickz"):
        load_settings({"SLUICE_CONFIG": str(config)})
    config.write_text("streams:\n  clicks: {delay: 5m}\n")
    with pytest.raises(ConfigError, match="allowed: watermark_delay, early_tolerance, idle_timeout"):
        load_settings({"SLUICE_CONFIG": str(config)})
    config.write_text("colour: blue\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_settings({"SLUICE_CONFIG": str(config)})


def test_unknown_pipeline_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="ad_clicks_hourly, user_activity_hourly"):
        load_settings({}).pipeline("ad_clicks_daily")
    assert load_settings({}).pipeline("ad_clicks_hourly").streams == ("impressions", "clicks")


def test_duration_and_timestamp_parsing() -> None:
    assert parse_duration("90s", "k") == timedelta(seconds=90)
    assert parse_duration("1.5h", "k") == timedelta(minutes=90)
    assert parse_duration(600, "k") == timedelta(minutes=10)
    assert parse_timestamp("2024-05-01T10:00:00-05:00", "k") == datetime(2024, 5, 1, 15, tzinfo=UTC)


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("streams: {clicks: 5}", "streams.clicks"),
        ("streams: [clicks]", "streams"),
        ("streams: {clicks: {idle_timeout: [1h]}}", "streams.clicks.idle_timeout"),
        ("landing: 5", "landing"),
        ("lake: [a, b]", "lake"),
        ("pipelines_path: 7", "pipelines_path"),
        ("now: 5", "now"),
        ("now: 0001-01-01T00:00:00Z", "now"),
        ("dedup_retention: {a: 1}", "dedup_retention"),
        ("max_files_per_trigger: true", "max_files_per_trigger"),
        ("shuffle_partitions: 2.5", "shuffle_partitions"),
        ("catchup_min_windows: -1", "catchup_min_windows"),
        ("spark_master: 5", "spark_master"),
        ("driver_memory: [2g]", "driver_memory"),
        ("executor_memory: 2 GB", "executor_memory"),
        ("delta_engine: [rs]", "delta_engine"),
        ("delta_engine: rs", "delta_engine"),
        ("vacuum_retention_hours: 1", "vacuum_retention_hours"),
        ("lateness_threshold: true", "lateness_threshold"),
        ("lease_ttl: 2s", "lease_ttl"),
        ("lease_ttl: [60s]", "lease_ttl"),
        ("pipelines: 5", "pipelines"),
        ("pipelines: {ad_clicks_hourly: 5}", "pipelines.ad_clicks_hourly"),
        ("pipelines: {ad_clicks_hourly: {windw: {size: 1h}}}", "pipelines.ad_clicks_hourly.windw"),
        ("pipelines: {ad_clicks_hourly: {window: 1h}}", "pipelines.ad_clicks_hourly.window"),
        ("pipelines: {ad_clicks_hourly: {window: {sise: 1h}}}", "pipelines.ad_clicks_hourly.window.sise"),
        ("pipelines: {ad_clicks_hourly: {window: {size: 0}}}", "pipelines.ad_clicks_hourly.window.size"),
    ],
)
def test_every_yaml_key_is_type_checked_naming_the_key_and_the_file(
    tmp_path: Path, yaml_text: str, key: str
) -> None:
    config = tmp_path / "sluice.yaml"
    config.write_text(yaml_text + "\n")
    with pytest.raises(ConfigError) as caught:
        load_settings({"SLUICE_CONFIG": str(config)})
    message = str(caught.value)
    assert message.startswith(f"{key}: ") and message.endswith(f"(in {config})")
    assert "\n" not in message


def test_yaml_values_of_the_right_type_are_converted(tmp_path: Path) -> None:
    config = tmp_path / "sluice.yaml"
    config.write_text(
        "now: 2024-05-01T06:00:00Z\nshuffle_partitions: '3'\ndelta_engine: NATIVE\nspark_master: local[2]\n"
        "lateness_threshold: 0\nlanding: /data/landing\nstreams: {clicks: }\n"
        "pipelines: {ad_clicks_hourly: {window: {hop: 30m}}}\n"
    )
    s = load_settings({"SLUICE_CONFIG": str(config)})
    assert s.now() == datetime(2024, 5, 1, 6, tzinfo=UTC)
    assert (s.shuffle_partitions, s.spark_master) == (3, "local[2]")
    assert s.lateness_threshold == 0.0 and s.landing.local() == Path("/data/landing")
    assert s.windows["ad_clicks_hourly"] == (timedelta(hours=1), timedelta(minutes=30))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 2),  # the default master, local[2]
        ({"SLUICE_SPARK_MASTER": "local[3]"}, 3),
        ({"SLUICE_SPARK_MASTER": "local"}, 1),
        ({"SLUICE_SPARK_MASTER": "local[*]"}, os.cpu_count()),
        ({"SLUICE_SPARK_MASTER": "spark://127.0.0.1:7077"}, 4),
        ({"SLUICE_SPARK_MASTER": "spark://127.0.0.1:7077", "SLUICE_SHUFFLE_PARTITIONS": "16"}, 16),
        ({"SLUICE_SHUFFLE_PARTITIONS": "5"}, 5),
    ],
)
def test_shuffle_partitions_follow_the_cores_of_a_local_master_unless_set(
    env: dict[str, str], expected: int
) -> None:
    assert load_settings(env).shuffle_partitions == expected


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00Z", "0001-01-01T00:30:00+01:00", "9999-12-31T23:00:00Z"])
def test_now_outside_the_supported_range_gives_the_range(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^SLUICE_NOW: .* use a time from 1900-01-01T00:00:00Z to 9999-01-01"):
        load_settings({"SLUICE_NOW": value})


def test_a_clean_environment_for_a_child_drops_the_settings_and_keeps_the_machines_jar_cache() -> None:
    from sluice.config import without_settings

    environ = {"SLUICE_HOME": "/h", "SLUICE_NOW": "2024-05-01T00:00:00Z", "SLUICE_JARS_DIR": "/jars",
               "SLUICE_MAVEN_REPO": "http://mirror", "PATH": "/bin"}
    assert without_settings(environ) == {"SLUICE_JARS_DIR": "/jars", "SLUICE_MAVEN_REPO": "http://mirror",
                                         "PATH": "/bin"}


@pytest.mark.parametrize("value", ["rs", "RS"])
def test_the_retired_delta_rs_engine_fails_fast_saying_what_to_do(value: str) -> None:
    """sluice 0.2's SLUICE_DELTA_ENGINE=rs chose delta-rs for the tables Spark writes; delta-spark writes them
    now, and a home still asking for rs is told to drop the setting instead of silently getting another engine."""
    with pytest.raises(ConfigError, match=r"SLUICE_DELTA_ENGINE: the delta-rs engine .rs. was retired.*Remove "
                                          r"SLUICE_DELTA_ENGINE"):
        load_settings({"SLUICE_DELTA_ENGINE": value})
    load_settings({"SLUICE_DELTA_ENGINE": "native"})  # what docker-compose files of 0.2 set: still loads
