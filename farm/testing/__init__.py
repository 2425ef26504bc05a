"""Test support shipped with farm, for its own tests and benchmarks and for handler authors
(as dramatiq ships its StubBroker): a scripted LLM and a one-process runner of a handler's
stages (``farm.testing.handlers``), and throwaway migrated PostgreSQL databases
(``farm.testing.database``). The service itself never imports it."""

from __future__ import annotations

from farm.testing.database import temporary_database
from farm.testing.handlers import ScriptedLLM, ScriptedResources, StagesRun, run_stages, stage_context

__all__ = ["ScriptedLLM", "ScriptedResources", "StagesRun", "run_stages", "stage_context", "temporary_database"]
