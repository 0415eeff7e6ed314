-- Version 2: fencing tokens and recovery points.
-- fence: the fencing token of the claim that owns (or last owned) the record,
-- drawn from {{table}}_fence, a one-row counter that only grows, so a key's
-- fences grow across releases and expiry too.
-- checkpoint: the record's recovery point (idem.StepStore), NULL if none.
ALTER TABLE {{table}} ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {{table}} ADD COLUMN checkpoint BLOB;
CREATE TABLE IF NOT EXISTS {{table}}_fence (id INTEGER PRIMARY KEY CHECK (id = 1), n INTEGER NOT NULL);
INSERT OR IGNORE INTO {{table}}_fence (id, n) VALUES (1, 0);
-- Stuck walks the abandoned records that hold a recovery point.
CREATE INDEX IF NOT EXISTS {{table}}_stuck ON {{table}} (lease_until) WHERE state = 1 AND checkpoint IS NOT NULL;
