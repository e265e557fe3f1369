"""The definition model: the public API's types, windows, time parsing, the registry of user
pipelines, and the runtime basics (Spark session, locks).
"""
