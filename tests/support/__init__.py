"""Test machinery that no wheel ships: the local test hosts (`testhost.py`, `python -m tests.support.testhost
up|down`) and the restart watchdog they run in place of systemd's `Restart=` (`restart_watchdog.py`)."""
