"""(e) The single-machine floor: the same ad_clicks logic in DuckDB, on the same landing files.

Reads the JSON Lines (explicit columns, bad lines ignored), parses ``event_time`` as RFC 3339 in UTC, dedups
ids, joins impressions LEFT OUTER clicks within [impression, impression + 30 min], aggregates per impression
and then per hour and ad, counts unmatched clicks per hour and ad, and writes both results as Parquet.
Threads are capped to match Spark's ``local[2]``.

    python bench/duckdb_floor.py --landing DIR --out DIR [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

T0 = time.monotonic()


def source(landing: Path, stream: str, columns: tuple[str, ...]) -> str:
    cols = ", ".join(f"{c}: 'VARCHAR'" for c in columns)
    files = [str(landing / stream / f"*.{ext}") for ext in ("json", "jsonl", "json.gz", "jsonl.gz")]
    present = [f for f in files if list(Path(f).parent.glob(Path(f).name))]
    return (
        f"read_json({present!r}, format='newline_delimited', columns={{{cols}}}, ignore_errors=true)"
        if present
        else "(SELECT " + ", ".join(f"NULL::VARCHAR AS {c}" for c in columns) + " WHERE false)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landing", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import duckdb

    t_import = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute(f"SET threads = {args.threads}")
    con.execute("SET TimeZone = 'UTC'")
    imp_src = source(args.landing, "impressions", ("impression_id", "ad_id", "user_id", "event_time"))
    clk_src = source(args.landing, "clicks", ("click_id", "impression_id", "ad_id", "user_id", "event_time"))
    con.execute(f"""
        CREATE TEMP TABLE imp AS
        SELECT impression_id, any_value(ad_id) AS ad_id, min(t) AS impression_time
        FROM (SELECT impression_id, ad_id, try_cast(event_time AS TIMESTAMPTZ)::TIMESTAMP AS t FROM {imp_src})
        WHERE impression_id IS NOT NULL AND ad_id IS NOT NULL AND t IS NOT NULL
        GROUP BY impression_id
    """)
    con.execute(f"""
        CREATE TEMP TABLE clk AS
        SELECT click_id, any_value(impression_id) AS click_impression_id, any_value(ad_id) AS click_ad_id,
               min(t) AS click_time
        FROM (SELECT click_id, impression_id, ad_id, try_cast(event_time AS TIMESTAMPTZ)::TIMESTAMP AS t
              FROM {clk_src})
        WHERE click_id IS NOT NULL AND impression_id IS NOT NULL AND ad_id IS NOT NULL AND t IS NOT NULL
        GROUP BY click_id
    """)
    t_load = time.monotonic()
    match = (
        "c.click_impression_id = i.impression_id AND c.click_time >= i.impression_time "
        "AND c.click_time <= i.impression_time + INTERVAL 30 MINUTE"
    )
    ad_clicks = f"""
        SELECT ws AS window_start, ws + INTERVAL 1 HOUR AS window_end, ad_id,
               count(*) AS impressions, sum(clicks)::BIGINT AS clicks, sum(clicks) / count(*) AS ctr
        FROM (SELECT time_bucket(INTERVAL 1 HOUR, i.impression_time) AS ws, i.impression_id, i.ad_id,
                     count(c.click_id) AS clicks
              FROM imp i LEFT JOIN clk c ON {match}
              GROUP BY ALL)
        GROUP BY ALL ORDER BY window_start, ad_id
    """
    unmatched = f"""
        SELECT time_bucket(INTERVAL 1 HOUR, c.click_time) AS window_start,
               time_bucket(INTERVAL 1 HOUR, c.click_time) + INTERVAL 1 HOUR AS window_end,
               c.click_ad_id AS ad_id, count(*) AS unmatched_clicks
        FROM clk c ANTI JOIN imp i ON {match}
        GROUP BY ALL ORDER BY window_start, ad_id
    """
    timings = {}
    for name, query in (("ad_clicks_hourly", ad_clicks), ("unmatched_clicks_hourly", unmatched)):
        started = time.monotonic()
        con.execute(f"COPY ({query}) TO '{args.out / (name + '.parquet')}' (FORMAT parquet)")
        timings[f"{name}_s"] = round(time.monotonic() - started, 3)
    con.close()
    values = {"import_s": round(t_import - T0, 3), "load_s": round(t_load - t_import, 3), **timings,
              "in_process_s": round(time.monotonic() - T0, 3)}
    print("BENCH " + json.dumps(values), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
