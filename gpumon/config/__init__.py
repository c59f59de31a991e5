"""Configuration: flags, GPUMON_* environment variables and an optional TOML file → one ``Settings``.

``settings`` (the object, its defaults and value parsers), ``sim`` (the simulator's settings) and
``resolve`` (precedence, the file, validation of everything else). The names below are the package's API.
"""

from gpumon.config.resolve import resolve, setup_logging
from gpumon.config.settings import (
    DEFAULT_PORT,
    DEFAULT_SIMULATION,
    ConfigError,
    Settings,
    default_baselines_path,
    parse_duration,
)

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_SIMULATION",
    "ConfigError",
    "Settings",
    "default_baselines_path",
    "parse_duration",
    "resolve",
    "setup_logging",
]
