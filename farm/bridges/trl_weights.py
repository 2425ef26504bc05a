"""TRL's ``WeightTransferProtocol`` over the farm's weight updates (``farm.bridges.trl`` re-exports it).

``pause`` opens a farm weight update, ``send_weights`` writes the streamed tensors as a safetensors
checkpoint that every paused backend loads, ``resume`` resumes them at the next version.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from farm.client import FarmClient

#: files of the base model directory copied next to each checkpoint's weights (config, tokenizer).
CHECKPOINT_SIDE_FILES = ("*.json", "*.jinja", "*.model", "*.txt")


class FarmWeightTransfer:
    """TRL's ``WeightTransferProtocol`` over the farm's weight updates; see the module docstring."""

    def __init__(
        self,
        farm_url: str,
        *,
        token: str | None,
        model_dir: str | Path,
        checkpoint_dir: str | Path,
        mode: Literal["keep", "wait", "abort"] = "keep",
        timeout_s: float = 900.0,
        client: FarmClient | None = None,
    ) -> None:
        self.client = client or FarmClient(farm_url, token=token, timeout_s=max(120.0, timeout_s))
        self.model_dir, self.checkpoint_dir = Path(model_dir), Path(checkpoint_dir)
        self.mode, self.timeout_s = mode, timeout_s
        self._update: int | None = None
        self._from_version = 0
        self._loaded: Path | None = None
        self.updates = 0

    def init_weight_transfer(self) -> None:
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.client.weights()  # the farm answers and we may drive its updates (401 otherwise)

    def pause(self) -> None:
        update = self.client.pause(mode=self.mode, timeout_s=self.timeout_s)
        self._update, self._from_version = update.id, update.from_version

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        """Write the streamed tensors as a checkpoint and have every paused backend load it.

        Raises:
            RuntimeError: no update is paused (``pause`` first).
            farm.errors.FarmError: a backend could not load it (the update is rolled back)."""
        if self._update is None:
            raise RuntimeError("send_weights before pause: no farm weight update is open")
        from safetensors.torch import save_file

        version = self._from_version + 1
        target = self.checkpoint_dir / f"v{version}"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        try:
            for pattern in CHECKPOINT_SIDE_FILES:
                for side in self.model_dir.glob(pattern):
                    shutil.copy2(side, target / side.name)
            tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in iterator}
            save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
            self.client.load_weights(self._update, path=target, version=version)
        except BaseException:
            self.client.rollback(self._update)
            self._update = None
            raise
        if self._loaded is not None and self._loaded != target:
            shutil.rmtree(self._loaded, ignore_errors=True)  # the backends serve the new one from now on
        self._loaded = target

    def resume(self) -> None:
        if self._update is None:
            return
        update, self._update = self._update, None
        self.client.resume(update)
        self.updates += 1

    def destroy(self) -> None:
        if self._update is not None:
            self.client.rollback(self._update)
            self._update = None
        self.client.close()
