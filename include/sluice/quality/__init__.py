"""Data quality per closed window: inputs and ledger states (checker), Great Expectations suites
(validator).
"""
