"""``--now`` as users type it (issue 29): a clock time or a time without a zone is a usage error (exit 64)
with a hint, never a guess. A zoneless time taken as UTC would shift every window by the zone's offset."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.cli import main
from sluice.config import ConfigError
from sluice.core.timeutil import parse_timestamp


@pytest.mark.parametrize(
    ("command", "now", "fragment"),
    [
        (["run", "ad_clicks_hourly"], "11:00", "'11:00' is not an RFC 3339 timestamp"),
        (["run", "ad_clicks_hourly"], "2024-05-01T11:00:00", "'2024-05-01T11:00:00' has no timezone; add Z for UTC "
                                                            "(2024-05-01T11:00:00Z) or an offset such as +02:00"),
        (["ingest", "events"], "2024-05-01 11:00", "has no timezone"),
        (["check", "ad_clicks_hourly"], "noon", "is not an RFC 3339 timestamp"),
        (["backfill", "ad_clicks_hourly", "--start", "2024-05-01T00:00:00Z", "--end", "2024-05-01T01:00:00Z"],
         "2024-05-01T11:00", "has no timezone"),
        (["status"], "11:00", "is not an RFC 3339 timestamp"),
    ],
)
def test_a_bad_now_is_a_usage_error_with_a_hint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str], now: str, fragment: str
) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse's exit, with sluice's usage code
        main(["--home", str(tmp_path / "home"), *command, "--now", now])
    code, err = exited.value.code, capsys.readouterr().err
    assert code == 64, err
    assert f"argument --now: '{now}'" in err and fragment in err
    assert not (tmp_path / "home").exists()


def test_timestamps_need_a_zone_except_aware_datetimes() -> None:
    assert parse_timestamp("2024-05-01T13:00:00+02:00", "k").isoformat() == "2024-05-01T11:00:00+00:00"
    assert parse_timestamp("2024-05-01t11:00:00z", "k").isoformat() == "2024-05-01T11:00:00+00:00"
    with pytest.raises(ConfigError, match="SLUICE_NOW: '2024-05-01T11:00:00' has no timezone"):
        parse_timestamp("2024-05-01T11:00:00", "SLUICE_NOW")
