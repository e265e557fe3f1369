"""Shared test helpers: landing files, reading tables, running cycles, and real alert receivers."""
