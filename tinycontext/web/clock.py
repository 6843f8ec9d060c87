"""current_datetime: the time now, for time-dependent questions (an agent has no clock)."""

from __future__ import annotations

from datetime import datetime, timezone


def current_datetime() -> dict:
    """UTC and local time as ISO 8601, the local zone's name and offset, and the weekday."""
    utc = datetime.now(timezone.utc).replace(microsecond=0)
    local = utc.astimezone()
    return {"utc": utc.isoformat(), "local": local.isoformat(), "timezone": local.tzname() or "",
            "utc_offset": local.strftime("%z"), "weekday": local.strftime("%A")}


def render_datetime(now: dict) -> str:
    return f"UTC {now['utc']}; local {now['local']} ({now['timezone']}, {now['weekday']})"
