-- A database as Lanes' first schema version made it (frozen: never edit; tests/test_store_schema.py upgrades it).
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
PRAGMA application_id = 1279348293;
PRAGMA user_version = 1;
