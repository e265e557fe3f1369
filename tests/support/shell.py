"""A user's shell: the environment a test gives the CLI it runs, in a child process or in this one.

The suite's own settings must not reach a command that a test runs as a user would: its workers export a
home, S3 credentials and Airflow connections of their own. What stays is the machine's (``MACHINE_VARIABLES``:
where the jars are cached) and everything that is not sluice's, AWS's or an Airflow connection.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest

from sluice.config import without_settings

# Credentials and connections: a user's shell has its own, or none.
NOT_THE_USERS = ("AWS_", "AIRFLOW_CONN_")


def user_shell(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``environ`` without the suite's settings, credentials or connections."""
    return {k: v for k, v in without_settings(environ).items() if not k.startswith(NOT_THE_USERS)}


def as_the_user(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str] | None = None) -> None:
    """This process's environment as :func:`user_shell` plus ``env``, until the test ends: for the CLI's
    ``main()`` run in this process. (A variable the test sets later, such as ``SLUICE_NOW``, is undone at the
    end only when ``env`` names it.)"""
    for key in set(os.environ) - set(user_shell()):
        monkeypatch.delenv(key)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
