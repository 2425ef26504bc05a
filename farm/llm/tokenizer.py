"""The policy's tokenizer: where it is and how it loads (transformers only when asked for)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from farm.config import Settings


def tokenizer_dir(settings: Settings) -> Path:
    """Where the policy's tokenizer is: ``llm.tokenizer_dir``, else the built-in backend's model."""
    return settings.llm.tokenizer_dir or settings.llm.builtin_model_dir or settings.data_dir / "tiny-model"


def load_tokenizer(settings: Settings) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir(settings)))


def end_of_turn_ids(tokenizer: Any) -> frozenset[int]:
    """The ids a served model stops at besides the tokenizer's eos: its ``generation_config.json``
    ``eos_token_id`` (Phi-3 ends a turn with ``<|end|>``, its tokenizer's eos is ``<|endoftext|>``).
    A backend stops there and vLLM shows none of them as text; empty when the folder has no such file."""
    path = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "generation_config.json"
    try:
        eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return frozenset()
    ids = eos if isinstance(eos, list) else [eos]
    return frozenset(i for i in ids if isinstance(i, int) and not isinstance(i, bool))
