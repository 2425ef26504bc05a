"""The ``swe`` task's config class alone: the API validates submits with it without loading the handler.

Found by the naming rule of :mod:`farm.handlers.registry` (``tasks.swe.handler`` -> ``tasks.swe.config``).
"""

from __future__ import annotations

from tasks.swe.dataset import SweConfig

config_class = SweConfig

__all__ = ["SweConfig", "config_class"]
