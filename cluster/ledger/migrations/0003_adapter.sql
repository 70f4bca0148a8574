-- The LoRA adapter a request ran with (NULL: the base model). `model` stays the base model's served
-- name, so per-model reports and quotas read as before; usage by adapter groups on this column.
ALTER TABLE ledger_requests ADD COLUMN adapter TEXT;
