-- Roam's user directory in PostgreSQL, schema version 1: the users every gateway reads at start
-- (`users-from:` in the server's configuration). Run once per database, as its owner:
--     psql -d roam -f /usr/share/roam/sql/001-users.sql
-- A gateway refuses to start on a database whose roam_schema says another version, naming the
-- migration to run.
BEGIN;

CREATE TABLE roam_schema (
    version integer NOT NULL
);
INSERT INTO roam_schema (version) VALUES (1);

CREATE TABLE roam_users (
    -- The login name (at most 255 bytes of UTF-8); for key-only users, a name for logs and status.
    name text PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 255),
    -- The client's X25519 public key, as `agent pubkey` prints it (44 characters of base64); NULL
    -- for a user who logs in with a password only.
    public_key text UNIQUE,
    -- The Argon2id hash `agent passwd` prints; NULL for a user with a key only.
    password_hash text,
    -- The user's inner addresses: at most one IPv4 and one IPv6 address, each a single host.
    addresses inet[] NOT NULL,
    -- Resolvers and search domains for this user instead of the gateway's (empty: the gateway's).
    resolvers inet[] NOT NULL DEFAULT '{}',
    search_domains text[] NOT NULL DEFAULT '{}',
    -- A disabled user is not served (their sessions end).
    enabled boolean NOT NULL DEFAULT true,
    changed_at timestamptz NOT NULL DEFAULT now(),
    CHECK (public_key IS NOT NULL OR password_hash IS NOT NULL)
);

COMMIT;
