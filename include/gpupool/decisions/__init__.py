"""Pure decisions: what the plan and the fast path choose, reading and writing nothing."""
