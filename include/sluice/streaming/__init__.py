"""Bronze -> gold: the streaming queries and the closing rule (runner), full cycles, backfills."""
