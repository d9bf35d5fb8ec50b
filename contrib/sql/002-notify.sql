-- Roam's user directory, schema version 2: every change to roam_users is announced on the
-- channel roam_users (the user's name as the payload), so gateways that LISTEN apply it at once
-- instead of at their next restart. Run after 001-users.sql, as the database's owner:
--     psql -d roam -f /usr/share/roam/sql/002-notify.sql
BEGIN;

CREATE FUNCTION roam_users_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Names are at most 255 bytes: the payload (at most 8000) always holds them. Sent when the
    -- transaction commits, once per name and transaction.
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('roam_users', OLD.name);
    ELSE
        PERFORM pg_notify('roam_users', NEW.name);
        IF TG_OP = 'UPDATE' AND OLD.name <> NEW.name THEN
            PERFORM pg_notify('roam_users', OLD.name);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER roam_users_changed AFTER INSERT OR UPDATE OR DELETE ON roam_users
    FOR EACH ROW EXECUTE FUNCTION roam_users_changed();

UPDATE roam_schema SET version = 2;

COMMIT;
