-- Roam's user directory, schema version 3: every gateway records who is connected to it, so one
-- query shows the fleet; and roam_users' rows are bounded in size. Each gateway replaces its own rows every 10 seconds (one transaction)
-- and removes them when it stops; a row not renewed for a minute is a gateway that died, which
-- roam_fleet leaves out. Run after 002-notify.sql, as the database's owner:
--     psql -d roam -f /usr/share/roam/sql/003-sessions.sql
-- Gateways need: GRANT SELECT, INSERT, UPDATE, DELETE ON roam_sessions TO <the gateways' role>;
BEGIN;

CREATE TABLE roam_sessions (
    -- The gateway's name (users-from's gateway: its host name unless set).
    gateway     text        NOT NULL CHECK (length(gateway) BETWEEN 1 AND 63),
    user_name   text        NOT NULL,
    addresses   inet[]      NOT NULL,
    -- Where the client's packets come from (its public address and port, after any NAT).
    endpoint    text        NOT NULL,
    -- Since when the client is reachable on this gateway.
    since       timestamptz NOT NULL,
    -- Inner bytes from the client and to it since the gateway began serving the user.
    bytes_in    bigint      NOT NULL DEFAULT 0,
    bytes_out   bigint      NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (gateway, user_name)
);
CREATE INDEX roam_sessions_user ON roam_sessions (user_name);

-- The fleet now: the sessions whose gateway renewed them within the last minute.
CREATE VIEW roam_fleet AS
    SELECT gateway, user_name, addresses, endpoint, since, bytes_in, bytes_out, updated_at
    FROM roam_sessions WHERE updated_at > now() - interval '1 minute';

-- What a good row can hold, so that one row can never cost a gateway more than a refusal: a key
-- as `agent pubkey` prints it, a hash as `agent passwd` makes it, one or two addresses, at most
-- eight resolvers and eight search domains (gateways read no more of a row than that anyway).
ALTER TABLE roam_users
    ADD CONSTRAINT roam_users_key_length CHECK (public_key IS NULL OR length(public_key) = 44),
    ADD CONSTRAINT roam_users_hash_length CHECK (password_hash IS NULL OR length(password_hash) < 128),
    ADD CONSTRAINT roam_users_addresses CHECK (cardinality(addresses) BETWEEN 1 AND 2),
    ADD CONSTRAINT roam_users_resolvers CHECK (cardinality(resolvers) <= 8),
    ADD CONSTRAINT roam_users_search_domains CHECK (cardinality(search_domains) <= 8);

-- No address is two enabled users': each enabled user's addresses are claimed in
-- roam_user_addresses, whose key refuses a second claim when it is written ("Key
-- (address)=(10.77.0.3) already exists"), concurrent writers included. Gateways refuse such a row
-- too, but an operator learns of it at once here. The trigger runs as the table's owner, so
-- writers of roam_users need no grant on roam_user_addresses.
CREATE TABLE roam_user_addresses (
    address inet PRIMARY KEY,
    name    text NOT NULL
);
CREATE INDEX roam_user_addresses_name ON roam_user_addresses (name);
INSERT INTO roam_user_addresses (address, name)
    SELECT DISTINCT a, name FROM roam_users, unnest(addresses) AS a WHERE enabled;

CREATE FUNCTION roam_users_claim_addresses() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM roam_user_addresses WHERE name = OLD.name;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.enabled THEN
        INSERT INTO roam_user_addresses (address, name) SELECT DISTINCT a, NEW.name FROM unnest(NEW.addresses) AS a;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER roam_users_claim_addresses AFTER INSERT OR UPDATE OR DELETE ON roam_users
    FOR EACH ROW EXECUTE FUNCTION roam_users_claim_addresses();

UPDATE roam_schema SET version = 3;

COMMIT;
