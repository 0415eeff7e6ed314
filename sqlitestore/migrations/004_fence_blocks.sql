-- Version 4: fences are handed out from blocks reserved in {{table}}_fence.
-- owner names the Store that reserved the block ending at n: while the row
-- still says so, nobody has drawn a fence since, and that Store hands out
-- the rest of its block without writing the row.
ALTER TABLE {{table}}_fence ADD COLUMN owner INTEGER NOT NULL DEFAULT 0;
