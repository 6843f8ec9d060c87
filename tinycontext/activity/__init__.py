"""Activity records: an opt-in, owner-only SQLite log of what the servers did, for the management views.

``activity=history`` keeps, per tool call, the operation, time, outcome, duration and counts (numbers
and outcome codes, never text); ``activity=content`` also keeps what was asked (the arguments), what
the model was shown (the rendered answer) and the domains of the URLs found and fetched. Callers are
kept only as salted hashes (HMAC-SHA256 with a random salt stored in the file). Old records go on
every write: past ``activity_retention_days`` and beyond the newest ``activity_max_events``.
"""

from .log import MEMORY, PAGES, SEARCHES, ActivityLog, Event, close_activity, counts_of, domains_of, open_activity

__all__ = ["ActivityLog", "Event", "open_activity", "close_activity", "counts_of", "domains_of", "SEARCHES", "PAGES", "MEMORY"]
