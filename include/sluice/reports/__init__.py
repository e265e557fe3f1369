"""What the lake says about its pipelines, for people: ``sluice status``, the ledger page and the demo read the same
views (windows per state, streams waiting, a window's changes)."""
