"""The shipped pipelines (SPEC section 4), each a small typed definition."""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType, TimestampType

from sluice.config import ConfigError
from sluice.pipelines import transforms as t
from sluice.pipelines.base import Output, PipelineDef, WindowSpec
from sluice.tables import TableDef


def _gold(name: str, key: str, metrics: list[tuple[str, object]]) -> TableDef:
    fields = [
        StructField("window_start", TimestampType(), True),
        StructField("window_end", TimestampType(), True),
        StructField(key, StringType(), True),
        *[StructField(m, dtype, True) for m, dtype in metrics],  # type: ignore[arg-type]
    ]
    return TableDef(f"gold/{name}", StructType(fields))


AD_CLICKS_HOURLY = _gold("ad_clicks_hourly", "ad_id",
                         [("impressions", LongType()), ("clicks", LongType()), ("ctr", DoubleType())])
UNMATCHED_CLICKS_HOURLY = _gold("unmatched_clicks_hourly", "ad_id", [("unmatched_clicks", LongType())])
USER_ACTIVITY_HOURLY = _gold("user_activity_hourly", "user_id", [("avg_events_per_10min", DoubleType())])

PIPELINES: dict[str, PipelineDef] = {
    "ad_clicks_hourly": PipelineDef(
        name="ad_clicks_hourly",
        inputs={"impressions": t.impressions_side, "clicks": t.clicks_side},
        outputs=(
            Output("ad_clicks_hourly", AD_CLICKS_HOURLY, lambda i, w: t.with_ctr(t.ad_clicks(i, w)),
                   key="ad_id", metrics=("impressions", "clicks", "ctr")),
            Output("unmatched_clicks_hourly", UNMATCHED_CLICKS_HOURLY, t.unmatched_clicks,
                   key="ad_id", metrics=("unmatched_clicks",)),
        ),
        lateness_bound=t.CLICK_JOIN_BOUND,
    ),
    "user_activity_hourly": PipelineDef(
        name="user_activity_hourly",
        inputs={"events": t.events_side},
        outputs=(
            Output("user_activity_hourly", USER_ACTIVITY_HOURLY, t.user_activity,
                   key="user_id", metrics=("avg_events_per_10min",)),
        ),
    ),
}


def get_pipeline(name: str, window: WindowSpec | None = None) -> PipelineDef:
    """The pipeline definition, optionally with another window; unknown names fail with the known ones."""
    try:
        pipeline = PIPELINES[name]
    except KeyError:
        raise ConfigError(f"unknown pipeline {name!r}; choose one of: {', '.join(sorted(PIPELINES))}") from None
    return replace(pipeline, window=window) if window else pipeline


__all__ = ["PIPELINES", "Output", "PipelineDef", "WindowSpec", "get_pipeline"]
