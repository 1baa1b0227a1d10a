"""The database schema as ordered migrations.

``PRAGMA user_version`` holds the schema version: migration ``n`` (1-based) takes a database from
version ``n - 1`` to ``n``. Never edit a released migration; append a new one, and refresh the
frozen copy in ``tests/data/schema.sql`` (``tests/test_store_schema.py`` says how).
``PRAGMA application_id`` marks the file as Lanes' own, so Lanes never writes into a stranger's file.

Times are Unix seconds (REAL). Statistics, settings and copy history snapshots are JSON text.
Token ids are int32 little-endian BLOBs, tagged with the model whose tokenizer made them.
"""

from __future__ import annotations

APPLICATION_ID = 0x4C414E45  # "LANE"

# v1: conversations, messages, per-conversation copy history, app settings.
_V1 = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT '',
    system_prompt TEXT NOT NULL DEFAULT '',
    settings TEXT NOT NULL DEFAULT '{}',
    recallable INTEGER NOT NULL DEFAULT 1 CHECK (recallable IN (0, 1)),
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX conversations_by_update ON conversations (updated_at DESC, id DESC);

CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'complete'
        CHECK (status IN ('complete', 'partial', 'cancelled', 'error')),
    error TEXT,
    stats TEXT,
    origins TEXT,
    tokens BLOB,
    tokens_model TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX messages_by_conversation ON messages (conversation_id, id);

CREATE TABLE copy_history (
    conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    source TEXT NOT NULL,
    accepted REAL NOT NULL,
    tested REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (conversation_id, source)
) WITHOUT ROWID;

CREATE TABLE settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
"""

# v2: full-text search over message content, kept in step by triggers; existing rows indexed.
# prefix = '1': a one-letter prefix query (the first key typed in a search box) reads an index,
# not ~1,000 expanded terms (262 -> ~110 ms at 100,000 messages, docs/benchmarks.md).
_V2 = """
CREATE VIRTUAL TABLE messages_fts USING fts5 (
    content, content = 'messages', content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 2',
    prefix = '1'
);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
END;
INSERT INTO messages_fts (messages_fts) VALUES ('rebuild');
"""

# v3: the comparison pane's A/B runs: one request answered with own copy rates off and on (and
# optionally with no drafts), each side repeated with the order alternated (engine/service/compare.py).
_V3 = """
CREATE TABLE comparisons (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER REFERENCES conversations (id) ON DELETE CASCADE,
    messages TEXT NOT NULL,
    settings TEXT NOT NULL DEFAULT '{}',
    model TEXT NOT NULL DEFAULT '',
    copy_history TEXT,
    status TEXT NOT NULL DEFAULT 'complete'
        CHECK (status IN ('complete', 'partial', 'cancelled', 'error')),
    created_at REAL NOT NULL
);
CREATE INDEX comparisons_by_conversation ON comparisons (conversation_id, id);

CREATE TABLE comparison_runs (
    comparison_id INTEGER NOT NULL REFERENCES comparisons (id) ON DELETE CASCADE,
    side TEXT NOT NULL CHECK (side IN ('off', 'on', 'plain')),
    repeat INTEGER NOT NULL CHECK (repeat >= 0),
    position INTEGER NOT NULL,
    content TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL CHECK (status IN ('complete', 'partial', 'cancelled', 'error')),
    error TEXT,
    stats TEXT,
    origins TEXT,
    tokens BLOB,
    copy_history_after TEXT,
    rates TEXT,
    PRIMARY KEY (comparison_id, side, repeat)
) WITHOUT ROWID;
"""

# v4: a reply's earlier versions (regenerate, edit and resend), browsable as < 1/2 >. The message row
# holds the version shown (its number in messages.version), so every reader of messages (the next
# prompt, Recall, search, exports) sees that one; the others wait here with the user message each
# answered (an edit changed it). Showing another version swaps it with the row's.
_V4 = """
ALTER TABLE messages ADD COLUMN version INTEGER NOT NULL DEFAULT 1 CHECK (version >= 1);
CREATE TABLE message_versions (
    message_id INTEGER NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    number INTEGER NOT NULL CHECK (number >= 1),
    prompt TEXT,
    content TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL CHECK (status IN ('complete', 'partial', 'cancelled', 'error')),
    error TEXT,
    stats TEXT,
    origins TEXT,
    tokens BLOB,
    tokens_model TEXT,
    created_at REAL NOT NULL,
    PRIMARY KEY (message_id, number)
) WITHOUT ROWID;
"""

MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4)
LATEST = len(MIGRATIONS)
