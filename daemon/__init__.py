"""cgd: the daemon, its placement engine, supervisor and client."""

__version__ = "0.1.0"
