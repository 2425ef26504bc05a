"""The ``math`` task's config class alone: the API validates submits with it without loading the handler.

Found by the naming rule of :mod:`farm.handlers.registry` (``tasks.math.handler`` -> ``tasks.math.config``).
"""

from __future__ import annotations

from tasks.math.dataset import MathConfig

config_class = MathConfig

__all__ = ["MathConfig", "config_class"]
