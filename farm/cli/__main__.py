"""``python -m farm.cli ...`` works as ``python -m farm ...`` and ``farm ...``."""

from farm.cli import main

main()
