"""Delta tables: the engine seam (delta-rs, native delta-spark), the streaming source over Delta,
table definitions, the ops tables (ledger) and maintenance.
"""
