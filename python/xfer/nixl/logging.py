"""NIXL's nixl.logging: loggers under "nixl" for NIXL code (get_logger(__name__)), printed to
stdout at INFO, the level taken from NIXL_LOG_LEVEL (TRACE, DEBUG, INFO, WARN, ERROR, FATAL).
NIXL_DEBUG_LOGGING=yes (or true, 1) makes a failing log call raise instead of being ignored.

xfer.nixl's own log ("xfer.nixl") is apart: NIXL_LOG_LEVEL sets it too (on stderr, where NIXL's
C++ core logs), when an agent is made (see _agent)."""

import logging
import os
import sys

ROOT = "nixl"
LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
          "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
FORMAT = "%(asctime)s NIXL %(levelname)-7s %(filename)s:%(lineno)d %(message)s"

_configured = False

__all__ = ["get_logger", "setup_logging", "set_log_level_by_env", "LEVELS"]


def level_from_env(default=None):
    """NIXL_LOG_LEVEL as a logging level; default when it is unset or not one of LEVELS."""
    return LEVELS.get(os.environ.get("NIXL_LOG_LEVEL", "").strip().upper(), default)


def set_log_level_by_env(logger):
    """Sets logger's level from NIXL_LOG_LEVEL (a warning, and no change, for a bad value)."""
    value = os.environ.get("NIXL_LOG_LEVEL")
    if not value:
        return
    level = level_from_env()
    if level is None:
        logger.warning("Invalid NIXL_LOG_LEVEL value %r (give one of %s); level unchanged",
                       value, ", ".join(LEVELS))
        return
    logger.setLevel(level)
    logger.info("Log level set to %s from NIXL_LOG_LEVEL environment variable", value.strip().upper())


def setup_logging():
    """Once: the "nixl" logger prints to stdout at INFO (or NIXL_LOG_LEVEL), not to its parents."""
    global _configured
    if _configured:
        return
    root = logging.getLogger(ROOT)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(FORMAT, "%Y-%m-%d %H:%M:%S"))
    handler.setLevel(logging.DEBUG)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False
    set_log_level_by_env(root)
    logging.raiseExceptions = os.environ.get("NIXL_DEBUG_LOGGING", "").lower() in ("yes", "true", "1")
    _configured = True


def get_logger(name):
    """The logger "nixl.<name>" (leading underscores dropped: "_api" is "nixl.api")."""
    setup_logging()
    return logging.getLogger(f"{ROOT}.{str(name).lstrip('_')}")
