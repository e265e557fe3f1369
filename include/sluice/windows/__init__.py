"""The window lifecycle: the ledger, its transitions, late data waiting, and the plans backfills and
corrections keep (``Window`` itself and window arithmetic are :mod:`sluice.core.windows`)."""
