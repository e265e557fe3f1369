"""Data quality per closed window: inputs and ledger states (checker), Great Expectations suites
(validator, with outcomes, frames, expectations, results and gx_context).
"""
