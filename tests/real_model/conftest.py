"""The chat app's fixtures the real-server chat uses (tests/chatapp/conftest.py)."""

from tests.chatapp.conftest import alice, db_connections_closed, demo_kb, errors_sent

__all__ = ["alice", "db_connections_closed", "demo_kb", "errors_sent"]
