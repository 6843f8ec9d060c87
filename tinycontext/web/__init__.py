"""Web evidence: search the web and hand the agent only the passages worth reading."""

from .guard import BlockedURLError, Decision, Guard, GuardedTransport, classify, decide

__all__ = ["BlockedURLError", "Decision", "Guard", "GuardedTransport", "classify", "decide"]
