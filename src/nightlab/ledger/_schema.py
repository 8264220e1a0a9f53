"""The ledger's schema: the version this nightlab reads and the migrations that reach it.

A ledger records its version in `meta.schema_version`; `Ledger` applies `MIGRATIONS[v:]` at open
(after a pre-migration backup, `nightlab.ledger.backup`). Tests read both names from this module.
"""

from __future__ import annotations

SCHEMA_VERSION = 6

# Each entry upgrades the schema from version i to i + 1. Never edit a shipped entry:
# append a new one and a test that upgrades a committed ledger of the old version.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE waves (
        id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL UNIQUE,
        design TEXT NOT NULL,
        description TEXT NOT NULL DEFAULT '',
        spec TEXT NOT NULL DEFAULT '{}',
        tier TEXT,
        base_snapshot TEXT,
        created_at REAL NOT NULL
    );
    CREATE TABLE experiments (
        id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL UNIQUE,
        snapshot TEXT NOT NULL,
        tree TEXT NOT NULL,
        parent TEXT,
        description TEXT NOT NULL,
        tier TEXT NOT NULL,
        seed INTEGER NOT NULL,
        wave TEXT REFERENCES waves(id),
        priority INTEGER NOT NULL DEFAULT 0,
        params TEXT NOT NULL DEFAULT '{}',
        source TEXT NOT NULL DEFAULT 'cli',
        status INTEGER NOT NULL,
        outcome TEXT,
        detail TEXT,
        verdict TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        submitted_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        adopted_at REAL
    );
    CREATE INDEX experiments_queue ON experiments(status, tier, priority, seq);
    CREATE INDEX experiments_tree ON experiments(tree, tier, seed);
    CREATE INDEX experiments_wave ON experiments(wave);
    CREATE TABLE attempts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        experiment_id TEXT NOT NULL REFERENCES experiments(id),
        number INTEGER NOT NULL,
        worker TEXT NOT NULL,
        started_at REAL NOT NULL,
        heartbeat_at REAL NOT NULL,
        ended_at REAL,
        exit_code INTEGER,
        failure TEXT,
        detail TEXT,
        log_path TEXT,
        handle TEXT
    );
    CREATE INDEX attempts_experiment ON attempts(experiment_id);
    CREATE INDEX attempts_open ON attempts(ended_at);
    CREATE TABLE metrics (
        experiment_id TEXT NOT NULL REFERENCES experiments(id),
        key TEXT NOT NULL,
        value REAL,
        text TEXT,
        PRIMARY KEY (experiment_id, key)
    );
    CREATE TABLE workers (
        name TEXT PRIMARY KEY,
        tier TEXT NOT NULL,
        backend TEXT NOT NULL,
        state TEXT NOT NULL,
        experiment_id TEXT,
        info TEXT NOT NULL DEFAULT '{}',
        updated_at REAL NOT NULL
    );
    CREATE TABLE controller (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        started_at REAL NOT NULL,
        heartbeat_at REAL NOT NULL,
        stop_requested INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        kind TEXT NOT NULL,
        experiment_id TEXT,
        worker TEXT,
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_experiment ON events(experiment_id);
    """,
    # v2 (issue 21): the machine health of a run (JSON, `fleet.health.Health`), what its
    # verdict was judged against (JSON: incumbent snapshot, figure, n) and its comparison
    # epoch (the key of the measurement setup: budget, profile, metric, timeout)
    """
    ALTER TABLE experiments ADD COLUMN health TEXT;
    ALTER TABLE experiments ADD COLUMN judged TEXT;
    ALTER TABLE experiments ADD COLUMN epoch TEXT NOT NULL DEFAULT '';
    """,
    # v3 (issue 12): the progress of each `nightlab search` wave as a typed row (`SearchProgress`),
    # moved out of the wave's spec JSON, where it was updated by a read and a separate write
    """
    CREATE TABLE search_waves (
        wave_id TEXT PRIMARY KEY REFERENCES waves(id),
        search_key TEXT NOT NULL,
        idx INTEGER NOT NULL,
        judged INTEGER NOT NULL DEFAULT 0,
        adopted TEXT,
        verdict TEXT,
        promotion TEXT,
        screened TEXT,
        stepped TEXT,
        settled INTEGER NOT NULL DEFAULT 0
    );
    INSERT INTO search_waves
        (wave_id, search_key, idx, judged, adopted, verdict, promotion, screened, stepped, settled)
    SELECT id, json_extract(spec, '$.search.key'), json_extract(spec, '$.search.index'),
        COALESCE(json_extract(spec, '$.search.judged'), 0), json_extract(spec, '$.search.adopted'),
        json_extract(spec, '$.search.verdict'), json_extract(spec, '$.search.promotion'),
        json_extract(spec, '$.search.screened'), json_extract(spec, '$.search.stepped'),
        COALESCE(json_extract(spec, '$.search.settled'), 0)
    FROM waves WHERE json_type(spec, '$.search') = 'object';
    UPDATE waves SET spec = json_remove(spec, '$.search') WHERE json_type(spec, '$.search') = 'object';
    """,
    # v4 (issue 12): the agent supervisor's run, a typed record changed in one transaction
    # (it was `.nightlab/agent/state.json`, rewritten whole; imported once by `agent.control`),
    # and its sessions, one row each
    """
    CREATE TABLE agent_run (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        pid INTEGER NOT NULL,
        status TEXT NOT NULL,
        agent TEXT NOT NULL,
        cli TEXT,
        command TEXT NOT NULL DEFAULT '[]',
        limits TEXT NOT NULL DEFAULT '{}',
        started_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        lab TEXT NOT NULL DEFAULT '',
        session INTEGER,
        agent_pid INTEGER,
        session_started_at REAL,
        transcript TEXT,
        prompt TEXT,
        last_activity REAL NOT NULL DEFAULT 0,
        experiments_submitted INTEGER NOT NULL DEFAULT 0,
        restarts TEXT NOT NULL DEFAULT '[]',
        restarts_total INTEGER NOT NULL DEFAULT 0,
        cost_usd REAL NOT NULL DEFAULT 0,
        api TEXT,
        api_outages TEXT NOT NULL DEFAULT '[]',
        error TEXT,
        stop_reason TEXT
    );
    CREATE TABLE agent_sessions (n INTEGER PRIMARY KEY, data TEXT NOT NULL);
    """,
    # v5 (issue 35): experiment trackers (W&B, MLflow). `trackers`: one row per destination, its
    # cursor over `events` (the outbox: every end, verdict and adoption is an event written in the
    # transaction that made it), the incumbent points it has, and its current outage; `tracker_runs`:
    # what each destination holds of each experiment (run id, page, digest of what was sent)
    """
    CREATE TABLE trackers (
        key TEXT PRIMARY KEY,
        cursor INTEGER NOT NULL DEFAULT 0,
        incumbent TEXT NOT NULL DEFAULT '{}',
        failures INTEGER NOT NULL DEFAULT 0,
        error TEXT,
        failing_since REAL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE tracker_runs (
        tracker TEXT NOT NULL,
        experiment_id TEXT NOT NULL REFERENCES experiments(id),
        run_id TEXT NOT NULL,
        url TEXT,
        digest TEXT NOT NULL,
        sent_at REAL NOT NULL,
        PRIMARY KEY (tracker, experiment_id)
    );
    CREATE INDEX tracker_runs_experiment ON tracker_runs(experiment_id);
    """,
    # v6 (issue 33): `experiments.tree` held a research identity (`nightlab.identity`), not a git
    # tree: the column, its index and the key of the incumbent a verdict was judged against (in
    # `judged`) are called `identity`. JSON output still carries `tree` too (`LEGACY_IDENTITY_KEY`)
    """
    ALTER TABLE experiments RENAME COLUMN tree TO identity;
    DROP INDEX experiments_tree;
    CREATE INDEX experiments_identity ON experiments(identity, tier, seed);
    UPDATE experiments SET judged = json_set(json_remove(judged, '$.tree'), '$.identity', json_extract(judged, '$.tree'))
        WHERE judged IS NOT NULL AND json_type(judged, '$.tree') IS NOT NULL;
    """,
]
