"""LLM layer, client side: token-in/token-out backend clients, the balancer, one job's LLM session
and trajectories. The built-in CPU backend is a server of its own in ``farm.llm.builtin``.

Importing this package stays light: torch and transformers load only in the built-in backend.
"""

from __future__ import annotations
