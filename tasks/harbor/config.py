"""The ``harbor`` task's config class alone: the API validates submits with it without loading the handler.

Found by the naming rule of :mod:`farm.handlers.registry` (``tasks.harbor.handler`` -> ``tasks.harbor.config``).
"""

from __future__ import annotations

from tasks.harbor.dataset import HarborConfig

config_class = HarborConfig

__all__ = ["HarborConfig", "config_class"]
