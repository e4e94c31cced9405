#!/usr/bin/env python
"""Django's command-line utility for Palisade."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    from config.startup import require_settings

    require_settings()
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
