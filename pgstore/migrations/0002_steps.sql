-- Version 2: fencing tokens and recovery points.
--
-- fence is the fencing token of the claim that owns (or last owned) the
-- record, drawn from {fence_seq}: a sequence never goes back, so a key's
-- fences grow across releases and expiry too. checkpoint is the record's
-- recovery point (idem.StepStore), NULL if none.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS fence bigint NOT NULL DEFAULT 0;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS checkpoint bytea;
CREATE SEQUENCE IF NOT EXISTS {fence_seq};

-- Stuck walks the abandoned in-flight records that hold a recovery point.
CREATE INDEX IF NOT EXISTS {stuck_index} ON {table} (lease_expires_at)
    WHERE token IS NOT NULL AND checkpoint IS NOT NULL;
