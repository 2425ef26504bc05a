"""The ``code`` task's config class alone: the API validates submits with it without loading the handler.

Found by the naming rule of :mod:`farm.handlers.registry` (``tasks.code.handler`` -> ``tasks.code.config``).
"""

from __future__ import annotations

from tasks.code.dataset import CodeConfig

config_class = CodeConfig

__all__ = ["CodeConfig", "config_class"]
