"""Everything kept in Redis besides the broker's own messages: queues, ledger, outcomes, shared state."""
