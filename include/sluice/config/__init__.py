"""The one typed place for sluice configuration: :class:`Settings`, resolved by :func:`load_settings`.

``settings`` holds the Settings dataclass, ``loading`` resolves it from defaults, YAML, the environment and the
CLI's overrides (its docstring lists the variables), ``values`` parses and checks each kind of value.
"""

from sluice.config.loading import MACHINE_VARIABLES, load_settings, without_settings
from sluice.config.settings import Settings
from sluice.config.values import check_folder, parse_time
from sluice.core.errors import ConfigError
from sluice.core.model import StreamSpec
from sluice.core.timeutil import parse_duration, parse_timestamp

__all__ = [
    "MACHINE_VARIABLES",
    "ConfigError",
    "Settings",
    "StreamSpec",
    "check_folder",
    "load_settings",
    "parse_duration",
    "parse_time",
    "parse_timestamp",
    "without_settings",
]
