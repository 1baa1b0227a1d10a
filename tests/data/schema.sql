-- user_version 4, application_id 0x4c414e45
CREATE INDEX comparisons_by_conversation ON comparisons (conversation_id, id);
CREATE INDEX conversations_by_update ON conversations (updated_at DESC, id DESC);
CREATE INDEX messages_by_conversation ON messages (conversation_id, id);
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
CREATE TABLE copy_history (
    conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    source TEXT NOT NULL,
    accepted REAL NOT NULL,
    tested REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (conversation_id, source)
) WITHOUT ROWID;
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
, version INTEGER NOT NULL DEFAULT 1 CHECK (version >= 1));
CREATE VIRTUAL TABLE messages_fts USING fts5 (
    content, content = 'messages', content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 2',
    prefix = '1'
);
CREATE TABLE 'messages_fts_config'(k PRIMARY KEY, v) WITHOUT ROWID;
CREATE TABLE 'messages_fts_data'(id INTEGER PRIMARY KEY, block BLOB);
CREATE TABLE 'messages_fts_docsize'(id INTEGER PRIMARY KEY, sz BLOB);
CREATE TABLE 'messages_fts_idx'(segid, term, pgno, PRIMARY KEY(segid, term)) WITHOUT ROWID;
CREATE TABLE settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
END;
