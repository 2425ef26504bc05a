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
"""

from __future__ import annotations

import queue
import random
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch

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


class EngineRequestError(ValueError):
    """A request the engine cannot run (prompt too long, token id out of range); the server answers 400."""


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
        self.prefix_cache = PrefixCache(max_tokens=prefix_cache_tokens)
        self._inbox: queue.Queue[_Sequence] = queue.Queue()
        self._running: list[_Sequence] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = {
            "requests": 0,
            "scripted_requests": 0,
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "cached_tokens": 0,
            "cache_hits": 0,
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
    def num_waiting(self) -> int:
        return self._inbox.qsize()

    def submit(
        self, prompt: list[int], params: SamplingParams, *, num_top_logprobs: int = 0, forced: list[int] | None = None
    ) -> Future[EngineOutput]:
        """Queue one generation; with ``forced`` (non-empty), emit those ids instead of sampling.

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
        )
        self._inbox.put(seq)
        return seq.future

    # ---- scheduler ------------------------------------------------------------------------------
    def _loop(self) -> None:
        with torch.inference_mode():
            while not self._stop.is_set():
                self._admit()
                # Retire before stepping: a prefill can already have sampled a stop id.
                self._retire()
                if not self._running:
                    continue
                try:
                    self._step(self._running)
                except Exception as exc:  # fail the batch, keep serving
                    for seq in self._running:
                        seq.future.set_exception(exc)
                    self._running = []

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
        except Exception as exc:  # a failed prefill must not take the engine thread down
            for seq in new:
                seq.future.set_exception(exc)
            return
        for seq, row in zip(new, logits, strict=True):
            self._sample(seq, row)
        self._running.extend(new)

    def _prepare(self, seq: _Sequence) -> None:
        """Give the sequence its KV buffers, seeded from the longest cached prefix of its prompt."""
        seq.queue_s = time.perf_counter() - seq.submitted_at
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
        for seq, row in zip(seqs, logits, strict=True):
            self._sample(seq, row)

    def _sample(self, seq: _Sequence, logits: torch.Tensor) -> None:
        forced = seq.forced[len(seq.out_ids)] if seq.forced is not None else None
        token, logprob, top = sample_token(logits, seq.params, seq.generator, seq.num_top_logprobs, forced=forced)
        seq.out_ids.append(token)
        seq.out_logprobs.append(logprob)
        if seq.num_top_logprobs:
            seq.top.append(top)
        self.stats["generation_tokens"] += 1

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
            # turn of this conversation starts with.
            tokens = seq.prompt + seq.out_ids[:-1]
            self.prefix_cache.insert(
                tokens, [k[:, : seq.length] for k in seq.keys], [v[:, : seq.length] for v in seq.values]
            )
            out = EngineOutput(
                token_ids=seq.out_ids,
                logprobs=seq.out_logprobs,
                finish_reason=reason,
                stop_token_id=stop_id,
                prompt_tokens=len(seq.prompt),
                cached_tokens=seq.cached_tokens,
                queue_s=seq.queue_s,
                top_logprobs=seq.top,
            )
            seq.future.set_result(out)
        self._running = still


def _as_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)
