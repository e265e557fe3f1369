"""The errors sluice raises for things a user can fix; the CLI prints their message without a traceback."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value or parameter is invalid; the message names the key and what is allowed."""


class LockTimeout(RuntimeError):
    """Another run held a pipeline's or a stream's lock for longer than the wait allowed."""


class DefinitionError(ConfigError):
    """A stream or pipeline definition is invalid; the message names the definition and what to fix."""
