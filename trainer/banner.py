"""`cli_lightning_logo()`: scripts written for Lightning print its logo before starting their CLI; ported, they
print this project's name instead, so the call keeps working after the imports are renamed."""

from __future__ import annotations

_BANNER = r"""
 _             _
| |_ _ __ __ _(_)_ __   ___ _ __
| __| '__/ _` | | '_ \ / _ \ '__|
| |_| | | (_| | | | | |  __/ |
 \__|_|  \__,_|_|_| |_|\___|_|
"""


def cli_lightning_logo() -> None:
    """Print the project's banner (Lightning's name for the function, so ported scripts run unchanged)."""
    print(_BANNER)
