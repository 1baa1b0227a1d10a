"""Lanes' store: conversations, messages, copy history and comparison runs in one SQLite file.

No Qt and no MLX here. ``Store`` (``store.py``) is the repository; ``session.py`` wires it to the
engine (one reply: history in, streamed text saved as it grows, copy history out); ``transcript.py``
exports and imports conversations. See docs/store.md.
"""
