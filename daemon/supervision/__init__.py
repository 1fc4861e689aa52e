"""The parts of daemon/supervisor.py that deal with circus and with raw processes."""
