-- The records table as migrations 1-6 leave it, in a schema of its own.
DROP SCHEMA IF EXISTS pgb CASCADE;
CREATE SCHEMA pgb;
CREATE TABLE pgb.r (
    scope text NOT NULL, key text NOT NULL, fingerprint text NOT NULL, token text,
    lease_expires_at timestamptz, expires_at timestamptz NOT NULL, attempt integer DEFAULT 1 NOT NULL,
    response bytea, fence bigint DEFAULT 0 NOT NULL, checkpoint bytea,
    PRIMARY KEY (scope, key)) WITH (fillfactor = 80);
CREATE SEQUENCE pgb.fence;
CREATE INDEX r_checkpoint ON pgb.r (scope, key) WHERE checkpoint IS NOT NULL;
CREATE INDEX r_expires_brin ON pgb.r USING brin (expires_at) WITH (pages_per_range = 16, autosummarize = on);
