"""The built-in CPU backend's generator: continuous batching over a transformers Llama model, with a prefix cache.

Each sequence has its own growable KV buffers (``farm.llm.builtin.forward``), so a sequence joins or leaves
the running batch between any two steps and a finished sequence's KV state goes into the prefix
cache as it is.

Logprobs are vLLM's default ``raw_logprobs``: the log-softmax of the model's unmodified logits,
before temperature, top-k or top-p. They are the logprobs a trainer recomputes with a plain forward
pass, whatever the sampling settings were.

A request may carry ``forced`` ids (a scripted reply, ``farm.llm.builtin.script``): its sequence then takes
the next forced id instead of sampling one, reports that id's logprob exactly as it would a sampled
one, and ends like any other sequence (a stop id, ``max_tokens``) or when the forced ids run out.
It batches and uses the prefix cache like any other sequence.

A request may also carry a ``listener``: the engine thread calls it with each id as it is sampled
(and its logprob), which is how the server streams. ``abort(future)`` ends a request early (its
client went away): waiting or running, it finishes with ``abort`` between two steps and frees its KV.

Weight updates follow vLLM 0.32's scheduler: ``pause(mode)`` holds new requests in the queue and
``abort`` ends the running ones (their answers carry ``finish_reason`` ``abort`` and what they had
sampled), ``wait`` lets them finish first, ``keep`` freezes them where they are until ``resume``.
``load_weights`` swaps the model's weights in place while paused (the prefix cache is dropped: its
KV came from the old weights; frozen sequences keep theirs, as vLLM's do), and every sampled token
is labelled with the ``weight_version`` in force when it was sampled.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from farm.errors import EngineRequestError
from farm.llm.builtin.forward import alloc_kv, forward
from farm.llm.builtin.kvcache import PrefixCache
from farm.llm.builtin.sampler import sample_token
from farm.llm.types import FinishReason, SamplingParams

#: sequences decoded together in one step.
DEFAULT_MAX_BATCH = 16
#: KV tokens the prefix cache may hold (the tiny model needs ~1 KiB per token).
DEFAULT_PREFIX_CACHE_TOKENS = 262_144
#: torch intra-op threads. One: a tiny model's matrices are too small to split, and on a shared CPU the
#: extra OpenMP threads spin against each other (measured: 4 concurrent requests went from 1300 to 250
#: tokens/s with 2 threads). Batching concurrent requests is what gives throughput here.
DEFAULT_TORCH_THREADS = 1
#: new prompt tokens prefilled in one forward pass (a single longer prompt still goes alone).
MAX_PREFILL_TOKENS = 8192
#: how long the idle loop waits for work before checking whether it should stop.
IDLE_POLL_S = 0.05


@dataclass
class EngineOutput:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    #: the stop or EOS id that ended generation, if any (vLLM's ``stop_reason`` for stop ids).
    stop_token_id: int | None
    prompt_tokens: int
    cached_tokens: int
    queue_s: float
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    #: (version, start, end) over ``token_ids``: the weight version each token was sampled with.
    weight_versions: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass
class _Sequence:
    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    num_top_logprobs: int
    future: Future[EngineOutput]
    submitted_at: float
    generator: torch.Generator
    #: ids to emit instead of sampling (a scripted reply); None samples.
    forced: list[int] | None = None
    keys: list[torch.Tensor] = field(default_factory=list)  # per layer: (kv_heads, capacity, head_dim)
    values: list[torch.Tensor] = field(default_factory=list)
    length: int = 0  # tokens whose KV is in the buffers
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    top: list[dict[int, float]] = field(default_factory=list)
    cached_tokens: int = 0
    queue_s: float = 0.0
    versions: list[tuple[int, int, int]] = field(default_factory=list)
    #: the engine's weights when the sequence's KV state was first computed.
    weights_epoch: int = 0
    #: called on the engine thread with each sampled id, its logprob and its top-N (streaming).
    listener: Callable[[int, float, dict[int, float]], None] | None = None


class Engine:
    """Runs generation requests from any thread on one background thread; ``submit`` returns a Future."""

    def __init__(
        self,
        *,
        model_dir: Path,
        max_batch: int = DEFAULT_MAX_BATCH,
        prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
        max_model_len: int | None = None,
        threads: int | None = DEFAULT_TORCH_THREADS,
        min_step_s: float = 0.0,
    ) -> None:
        from transformers import AutoModelForCausalLM

        if threads:
            torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()  # type: ignore[no-untyped-call]
        config = self.model.config
        self.vocab_size: int = config.vocab_size
        self.max_model_len: int = max_model_len or config.max_position_embeddings
        eos = config.eos_token_id
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        self.eos_ids = frozenset(_as_list(eos) + _as_list(gen_eos))
        self.max_batch = max_batch
        #: the least time one decode step takes (0: as fast as the CPU goes); models a bigger model's pace.
        self.min_step_s = min_step_s
        self.prefix_cache = PrefixCache(max_tokens=prefix_cache_tokens)
        self._inbox: queue.Queue[_Sequence] = queue.Queue()
        self._running: list[_Sequence] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: control operations (pause, resume, load), run by the engine thread between two steps.
        self._control: queue.Queue[Callable[[], None]] = queue.Queue()
        #: None (serving), "wait" (draining the running sequences), "paused".
        self._pause: Literal["wait", "paused"] | None = None
        self._drained: list[Future[None]] = []
        #: the label of the weights loaded now; every sampled token carries the one in force.
        self.weight_version = 0
        #: bumped by every load: KV state computed before it is not the new weights' to reuse.
        self._weights_epoch = 0
        self.stats = {
            "requests": 0,
            "scripted_requests": 0,
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "cached_tokens": 0,
            "cache_hits": 0,
            "forward_passes": 0,
        }

    # ---- public API -----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="farm-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def paused(self) -> bool:
        return self._pause is not None

    # ---- weight updates (each returns a Future the engine thread completes) -----------------------
    def pause(self, mode: Literal["abort", "wait", "keep"]) -> Future[None]:
        """Stop taking new requests; the running ones end (abort), finish first (wait) or freeze (keep).
        The future is done once nothing runs any more (for keep: at once)."""

        def op(done: Future[None]) -> None:
            if mode == "abort":
                for seq in [*self._running, *self._waiting()]:
                    self._finish(seq, FinishReason.ABORT, None)
                self._running = []
            if mode == "wait" and self._running:
                self._pause = "wait" if self._pause is None else self._pause
                self._drained.append(done)
                return
            self._pause = "paused"
            done.set_result(None)

        return self._call(op)

    def abort_all(self) -> Future[int]:
        """End every running and waiting request now (``finish_reason`` abort); keep serving."""
        done: Future[int] = Future()

        def op() -> None:
            seqs = [*self._running, *self._waiting()]
            for seq in seqs:
                self._finish(seq, FinishReason.ABORT, None)
            self._running = []
            done.set_result(len(seqs))

        self._control.put(op)
        return done

    def resume(self) -> Future[None]:
        def op(done: Future[None]) -> None:
            self._pause = None
            for waiting in self._drained:  # a wait-pause resumed before it drained
                waiting.set_result(None)
            self._drained = []
            done.set_result(None)

        return self._call(op)

    def set_weight_version(self, version: int) -> Future[None]:
        def op(done: Future[None]) -> None:
            self.weight_version = version
            done.set_result(None)

        return self._call(op)

    def load_weights(self, path: Path) -> Future[None]:
        """Load a checkpoint directory's weights (safetensors, the same architecture) in place."""

        def op(done: Future[None]) -> None:
            try:
                _load_state(self.model, path)
            except Exception as exc:  # a bad checkpoint: the old weights stay, the caller is told
                done.set_exception(exc)
                return
            self._weights_epoch += 1
            self.prefix_cache.clear()
            done.set_result(None)

        return self._call(op)

    def _call(self, op: Callable[[Future[None]], None]) -> Future[None]:
        done: Future[None] = Future()
        self._control.put(lambda: op(done))
        return done

    def _waiting(self) -> list[_Sequence]:
        out = []
        while True:
            try:
                out.append(self._inbox.get_nowait())
            except queue.Empty:
                return out

    @property
    def num_waiting(self) -> int:
        return self._inbox.qsize()

    def submit(
        self,
        prompt: list[int],
        params: SamplingParams,
        *,
        num_top_logprobs: int = 0,
        forced: list[int] | None = None,
        listener: Callable[[int, float, dict[int, float]], None] | None = None,
    ) -> Future[EngineOutput]:
        """Queue one generation; with ``forced`` (non-empty), emit those ids instead of sampling.
        ``listener`` is called on the engine thread with each id sampled and its logprob.

        Raises:
            EngineRequestError: the prompt is empty, fills the context, or holds an unknown id.
        """
        if not prompt:
            raise EngineRequestError("the prompt is empty")
        if forced is not None and not forced:
            raise EngineRequestError("forced ids must not be empty")
        bad = [t for t in [*prompt, *(forced or [])] if not 0 <= t < self.vocab_size]
        if bad:
            raise EngineRequestError(f"token id {bad[0]} is out of vocabulary (size {self.vocab_size})")
        if len(prompt) >= self.max_model_len:
            raise EngineRequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt "
                f"contains {len(prompt)} input tokens, which exceeds this limit even without any output tokens. "
                "Please reduce the length of the input prompt."
            )
        # As vLLM does: max_tokens is clamped to the context left; generation then ends with "length".
        if len(prompt) + params.max_tokens > self.max_model_len:
            params = params.model_copy(update={"max_tokens": self.max_model_len - len(prompt)})
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        seq = _Sequence(
            prompt=list(prompt),
            params=params,
            stop_ids=self.eos_ids | frozenset(params.stop_token_ids),
            num_top_logprobs=num_top_logprobs,
            future=Future(),
            submitted_at=time.perf_counter(),
            generator=torch.Generator().manual_seed(seed),
            forced=list(forced) if forced is not None else None,
            listener=listener,
        )
        self._inbox.put(seq)
        return seq.future

    def abort(self, future: Future[EngineOutput]) -> None:
        """End the request of ``future`` (waiting or running) at the next step boundary, answered
        with what it has and ``finish_reason`` abort; a request already finished is left as it is."""

        def op() -> None:
            if future.done():
                return
            for seq in self._running:
                if seq.future is future:
                    self._running.remove(seq)
                    self._finish(seq, FinishReason.ABORT, None)
                    return
            for seq in self._waiting():
                if seq.future is future:
                    self._finish(seq, FinishReason.ABORT, None)
                else:
                    self._inbox.put(seq)

        self._control.put(op)

    # ---- scheduler ------------------------------------------------------------------------------
    def _loop(self) -> None:
        with torch.inference_mode():
            while not self._stop.is_set():
                self._run_control()
                if self._pause == "paused":
                    try:
                        self._control.get(timeout=IDLE_POLL_S)()
                    except queue.Empty:
                        pass
                    continue
                if self._pause is None:
                    self._admit()
                # Retire before stepping: a prefill can already have sampled a stop id.
                self._retire()
                if self._pause == "wait" and not self._running:
                    self._pause = "paused"
                    for done in self._drained:
                        done.set_result(None)
                    self._drained = []
                    continue
                if not self._running:
                    if self._pause == "wait":
                        time.sleep(IDLE_POLL_S)
                    continue
                try:
                    started = time.perf_counter()
                    self._step(self._running)
                    if (rest := self.min_step_s - (time.perf_counter() - started)) > 0:
                        time.sleep(rest)
                except Exception as exc:  # fail the batch, keep serving
                    for seq in self._running:
                        seq.future.set_exception(exc)
                    self._running = []

    def _run_control(self) -> None:
        while True:
            try:
                op = self._control.get_nowait()
            except queue.Empty:
                return
            op()

    def _admit(self) -> None:
        """Take waiting requests (up to the batch size) and prefill them together in one forward pass."""
        new: list[_Sequence] = []
        tokens = 0
        while len(self._running) + len(new) < self.max_batch and tokens < MAX_PREFILL_TOKENS:
            idle = not self._running and not new
            try:
                seq = self._inbox.get(timeout=IDLE_POLL_S) if idle else self._inbox.get_nowait()
            except queue.Empty:
                break
            self._prepare(seq)
            new.append(seq)
            tokens += len(seq.prompt) - seq.length
        if not new:
            return
        try:
            logits = forward(self.model, new, [s.prompt[s.length :] for s in new])
            self.stats["forward_passes"] += 1
        except Exception as exc:  # a failed prefill must not take the engine thread down
            for seq in new:
                seq.future.set_exception(exc)
            return
        for seq, row in zip(new, logits, strict=True):
            try:
                self._sample(seq, row)
            except Exception as exc:  # that request fails; the engine thread goes on serving
                seq.future.set_exception(exc)
                continue
            self._running.append(seq)

    def _prepare(self, seq: _Sequence) -> None:
        """Give the sequence its KV buffers, seeded from the longest cached prefix of its prompt."""
        seq.queue_s = time.perf_counter() - seq.submitted_at
        seq.weights_epoch = self._weights_epoch
        reused, keys, values = self.prefix_cache.lookup(seq.prompt, max_len=len(seq.prompt) - 1)
        capacity = len(seq.prompt) + seq.params.max_tokens
        seq.keys, seq.values = alloc_kv(self.model.config, capacity, keys, values, reused)
        seq.length = reused
        seq.cached_tokens = reused
        self.stats["requests"] += 1
        self.stats["scripted_requests"] += int(seq.forced is not None)
        self.stats["prompt_tokens"] += len(seq.prompt)
        self.stats["cached_tokens"] += reused
        self.stats["cache_hits"] += int(reused > 0)

    def _step(self, seqs: list[_Sequence]) -> None:
        logits = forward(self.model, seqs, [[s.out_ids[-1]] for s in seqs])
        self.stats["forward_passes"] += 1
        for seq, row in zip(seqs, logits, strict=True):
            self._sample(seq, row)

    def _sample(self, seq: _Sequence, logits: torch.Tensor) -> None:
        forced = seq.forced[len(seq.out_ids)] if seq.forced is not None else None
        token, logprob, top = sample_token(logits, seq.params, seq.generator, seq.num_top_logprobs, forced=forced)
        n = len(seq.out_ids)
        if seq.versions and seq.versions[-1][0] == self.weight_version:
            seq.versions[-1] = (self.weight_version, seq.versions[-1][1], n + 1)
        else:
            seq.versions.append((self.weight_version, n, n + 1))
        seq.out_ids.append(token)
        seq.out_logprobs.append(logprob)
        if seq.num_top_logprobs:
            seq.top.append(top)
        self.stats["generation_tokens"] += 1
        if seq.listener is not None:
            seq.listener(token, logprob, top)

    def _retire(self) -> None:
        still: list[_Sequence] = []
        for seq in self._running:
            last = seq.out_ids[-1]
            if last in seq.stop_ids or (seq.forced is not None and len(seq.out_ids) == len(seq.forced)):
                reason, stop_id = FinishReason.STOP, last
            elif len(seq.out_ids) >= seq.params.max_tokens:
                reason, stop_id = FinishReason.LENGTH, None
            else:
                still.append(seq)
                continue
            # The KV buffers hold prompt + every sampled id but the last: exactly the prefix the next
            # turn of this conversation starts with (unless other weights made part of it).
            if seq.weights_epoch == self._weights_epoch:
                tokens = seq.prompt + seq.out_ids[:-1]
                self.prefix_cache.insert(
                    tokens, [k[:, : seq.length] for k in seq.keys], [v[:, : seq.length] for v in seq.values]
                )
            self._finish(seq, reason, stop_id)
        self._running = still

    def _finish(self, seq: _Sequence, reason: FinishReason, stop_id: int | None) -> None:
        out = EngineOutput(
            token_ids=seq.out_ids,
            logprobs=seq.out_logprobs,
            finish_reason=reason,
            stop_token_id=stop_id,
            prompt_tokens=len(seq.prompt),
            cached_tokens=seq.cached_tokens,
            queue_s=seq.queue_s,
            top_logprobs=seq.top,
            weight_versions=seq.versions,
        )
        if not seq.future.done():
            seq.future.set_result(out)


def _load_state(model: Any, path: Path) -> None:
    """Copy a checkpoint directory's tensors into ``model`` in place.

    Raises:
        FileNotFoundError: no safetensors file in ``path``.
        ValueError: the checkpoint lacks a parameter of the model, or shapes differ.
    """
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {path}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    params = dict(model.named_parameters())
    missing = [name for name in params if name not in state and not _tied(model, name)]
    if missing:
        raise ValueError(f"{path} lacks {len(missing)} of the model's parameters, e.g. {missing[0]!r}")
    # Every shape is checked before anything is copied: a bad checkpoint leaves the old weights whole.
    for name, tensor in state.items():
        if name in params and params[name].shape != tensor.shape:
            raise ValueError(f"{name}: shape {tuple(tensor.shape)} in {path}, {tuple(params[name].shape)} here")
    with torch.no_grad():
        for name, tensor in state.items():
            if name in params:
                params[name].copy_(tensor)


def _tied(model: Any, name: str) -> bool:
    """Whether ``name`` is the output embedding tied to the input one (saved once)."""
    return name == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))


def _as_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)
