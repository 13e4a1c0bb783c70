"""The engine core: validates requests, runs scheduler + runner steps, finishes requests."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import replace
from typing import Unpack
from urllib.parse import urlsplit

import torch

from engine.async_scheduler import AsyncScheduler
from engine.async_step import AsyncSteps
from engine.attention import AttentionBackend, AttentionSpec
from engine.attention_backends import select_attention_backend
from engine.config import EngineConfig
from engine.kv_block_codec import KVLayout
from engine.kv_cache import BlockManager
from engine.kv_cache_size import kv_cache_num_blocks
from engine.kv_connector import KVConnector
from engine.loaded_model import LoadedModel, load_model, model_key
from engine.metrics import EngineStats
from engine.model_runner import ModelRunner
from engine.outputs import CoreOutput
from engine.redis_kv_store import RedisKVStore
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, computed_and_prefill
from engine.sequence import RequestOptions, Sequence, Status
from engine.speculative import Speculator
from engine.speculator_setup import build_speculator
from engine.step_window import StepTime, StepWindow
from engine.tokenizer import Tokenizer

log = logging.getLogger("semgate.engine")

Prompt = str | list[int]


def prompt_token_ids(
    prompt: Prompt,
    params: SamplingParams,
    tokenizer: Tokenizer,
    vocab_size: int,
    max_model_len: int,
) -> list[int]:
    """A prompt's token ids, checked against the model; raises ValueError with the reason."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty")
        token_ids = tokenizer.encode(prompt)
    else:
        token_ids = list(prompt)
        if any(not isinstance(t, int) or not 0 <= t < vocab_size for t in token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab_size})")
    if not token_ids:
        raise ValueError("prompt is empty")
    if len(token_ids) + params.max_tokens > max_model_len:
        raise ValueError(
            f"prompt ({len(token_ids)} tokens) plus max_tokens ({params.max_tokens}) is over "
            f"the model's context length of {max_model_len} tokens"
        )
    return token_ids


class LLMEngine:
    def __init__(self, config: EngineConfig, model: LoadedModel | None = None) -> None:
        """`model`: one already built for this config's model key (see loaded_model.py);
        None loads it."""
        started = time.perf_counter()
        self.config = config
        self.claim_threads()
        device = torch.device(config.device)
        if model is None:
            model = load_model(config)
        elif model.key != model_key(config):
            raise ValueError(f"the model was built for {model.key}, not {model_key(config)}")
        self.loaded = model  # another engine of the same model key may share it
        model_config, self.tokenizer, self.model = model.config, model.tokenizer, model.model
        self.model_config = model_config
        self.max_model_len = model.max_model_len
        spec = AttentionSpec(
            device, config.torch_dtype, config.torch_kv_cache_dtype, model_config.head_dim
        )
        attention = select_attention_backend(config.attention_backend, spec)
        self.block_size = config.block_size or attention.preferred_block_size
        # Without chunking a prompt must fit one step, so the budget covers the longest.
        budget = config.max_num_batched_tokens
        assert budget is not None  # EngineConfig.__post_init__ gives it its default
        if not config.chunked_prefill:
            budget = max(budget, self.max_model_len)
        # Before anything else takes memory: on CUDA it measures what the weights and a
        # forward of one step's budget leave free.
        num_blocks, kv_cache_size = kv_cache_num_blocks(
            config, self.model, attention, self.block_size, budget
        )
        if num_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"{num_blocks} KV blocks of {self.block_size} tokens ({kv_cache_size}) cannot "
                f"hold one request of max_model_len={self.max_model_len}; lower max_model_len "
                "or give the cache more memory (kv_cache_memory, kv_cache_memory_fraction, "
                "gpu_memory_utilization)"
            )
        self.block_manager = BlockManager(num_blocks, self.block_size, config.prefix_caching)
        self.kv_connector = kv_store_connector(config, model, attention, self.block_size, device)
        why_sync = sync_only_because(config)
        if config.async_scheduling and why_sync:
            log.info("async scheduling is off: %s", why_sync)
        scheduler = AsyncScheduler if config.async_scheduling and not why_sync else Scheduler
        self.scheduler = scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=budget,
            enable_chunked_prefill=config.chunked_prefill,
            eos_token_ids=self.tokenizer.eos_token_ids,
            max_model_len=self.max_model_len,
            kv_connector=self.kv_connector,
        )
        self.runner = ModelRunner(
            self.model,
            attention=attention,
            num_blocks=num_blocks,
            block_size=self.block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=self.max_model_len,
            device=device,
            enforce_eager=bool(config.enforce_eager),
            max_spec_tokens=config.num_spec_tokens if config.spec_method else 0,
            seed=config.seed,
        )
        if self.kv_connector is not None:
            self.kv_connector.register_kv_caches(self.runner.kv_caches)
        self.sequences: dict[str, Sequence] = {}
        # Finished outputs that wait for their KV to be saved (a prefill server's answer).
        self.unanswered: dict[str, CoreOutput] = {}
        self.stats = EngineStats(spec_method=config.spec_method)
        self.step_window = StepWindow()
        self.last_step: StepTime | None = None  # the latest step's, None if it ran none
        self.speculator = build_speculator(
            config, self.model, self.runner, self.block_manager, self.max_model_len, self.stats
        )
        self.runner.drafter = self.speculator.drafter if self.speculator is not None else None
        self.runner.capture_graphs()
        self.async_steps = (
            AsyncSteps(self, self.scheduler) if isinstance(self.scheduler, AsyncScheduler) else None
        )
        log.info(
            "engine ready in %.2fs: %s on %s (%s, weights %s), %d %s KV blocks of %d tokens "
            "(%s), attention=%s, %s",
            time.perf_counter() - started,
            config.model_path.name,
            config.device,
            config.dtype,
            config.quantization or config.dtype,
            num_blocks,
            config.kv_cache_dtype,
            self.block_size,
            kv_cache_size,
            attention.name,
            self.runner.graph_mode,
        )
        if self.async_steps is not None:
            log.info("async scheduling: one step in flight")
        if self.speculator is not None:
            log.info("speculative decoding: %s", self.speculator.description)
        if config.kv_store is not None:
            log.info("KV store: %s, role %s", _without_password(config.kv_store), config.kv_role)

    def make_sequence(
        self, prompt: Prompt, params: SamplingParams, **options: Unpack[RequestOptions]
    ) -> Sequence:
        """Validates and tokenizes a request; raises ValueError with the reason."""
        token_ids = prompt_token_ids(
            prompt, params, self.tokenizer, self.model_config.vocab_size, self.max_model_len
        )
        rid = options.get("request_id") or uuid.uuid4().hex
        salt, kv = options.get("cache_salt"), options.get("kv_transfer_params")
        return Sequence(rid, token_ids, params, salt, kv)

    def add_sequence(self, seq: Sequence) -> None:
        if seq.request_id in self.sequences:
            raise ValueError(f"request id {seq.request_id!r} is already running")
        self.sequences[seq.request_id] = seq
        self.scheduler.add(seq)

    def claim_threads(self) -> None:
        """Gives the building thread, which also steps the engine (the caller of `LLM`, the
        core process of `AsyncLLM`), the configured intra-op thread count (and so the
        forward's worker thread of async scheduling, engine/async_step.py). Torch keeps the
        count per thread, but a thread's first parallel op re-applies the count last set
        anywhere, unless the thread asked for its count before: get, then set. Without
        this an engine stepped beside an embedder ran on the embedder workers' one thread
        of two (a 400-token prefill took 1.43-1.56 s instead of 1.20 s)."""
        if self.config.device == "cpu":
            assert self.config.num_threads is not None  # EngineConfig gives it its default
            torch.get_num_threads()
            torch.set_num_threads(self.config.num_threads)

    def add_request(
        self, prompt: Prompt, params: SamplingParams, **options: Unpack[RequestOptions]
    ) -> str:
        seq = self.make_sequence(prompt, params, **options)
        self.add_sequence(seq)
        return seq.request_id

    def reset_prefix_cache(self) -> bool:
        """Empties the prefix cache; False (and nothing changed) while requests run."""
        return self.block_manager.reset_prefix_cache()

    def has_unfinished(self) -> bool:
        if self.async_steps is not None:  # a step in flight is unfinished work too
            return self.async_steps.has_unfinished()
        return self.scheduler.has_unfinished()

    def waits_on_transfers(self) -> bool:
        """Whether nothing can run until the KV connector finishes a load or a save (its
        `on_progress` callback says when)."""
        return self.kv_connector is not None and self.kv_connector.pending()

    def abort(self, request_id: str) -> CoreOutput | None:
        """Ends a request now and frees its KV blocks (once the connector is done with
        them); None if it is not running."""
        seq = self.sequences.get(request_id)
        if seq is None:
            return None
        self.scheduler.finish(seq, "abort")
        self._forget(seq)
        return self._output(seq, 0, time.perf_counter())

    def step(self) -> list[CoreOutput]:
        """One step: schedule -> run -> update -> the new tokens of each request that got
        some (engine/output_processor.py turns them into RequestOutputs). With a KV
        connector: loads start before the forward, saves after it, and answers that
        waited for their saves go out."""
        if self.async_steps is not None:
            return self.async_steps.step()
        step_started = time.perf_counter()
        self.last_step = None
        answered = self._answer_released(self.scheduler.finish_transfers())
        scheduled = self.scheduler.schedule()
        connector = self.kv_connector
        if connector is not None:
            connector.start_load_kv()
        if not scheduled:
            return answered
        started = time.perf_counter()
        spec = self.speculator
        new_tokens = self.runner.execute(scheduled, spec.draft_probs if spec else {})
        seconds = time.perf_counter() - started
        num_computed, num_prefill = computed_and_prefill(scheduled)
        if spec is not None:
            sampling = (item for item in scheduled if item.samples)
            for item, tokens in zip(sampling, new_tokens, strict=True):
                spec.record(item.seq, len(item.spec_token_ids), len(tokens))
        sampled = self.scheduler.update(scheduled, new_tokens)
        if connector is not None:  # the finished saved theirs (request_finished)
            connector.save_kv([item.seq for item in scheduled if not item.seq.finished])
        outputs = self.outputs(sampled, answered)
        if spec is not None:
            spec.observe_step(num_computed, seconds)
            self._propose(spec)
        self.record_step(step_started, num_computed, num_prefill)
        return outputs

    def outputs(
        self, sampled: list[tuple[Sequence, int]], outputs: list[CoreOutput]
    ) -> list[CoreOutput]:
        """outputs, then those of the sequences a step's update returned; the finished
        ones are forgotten."""
        finished = Status.FINISHED
        now = time.perf_counter()
        for seq, appended in sampled:
            tokens = seq.token_ids
            if seq.status is not finished and len(tokens) - seq.num_prompt_tokens != appended:
                # Most outputs: a running request's new tokens, no counters (_output's
                # tuple, made without NamedTuple's Python-level __new__).
                new = tokens[len(tokens) - appended :]
                out = (seq.request_id, new, False, None, now, None, None)
                outputs.append(tuple.__new__(CoreOutput, out))
                continue
            if seq.status is finished:
                self._forget(seq)
            output = self._output(seq, appended, now)
            # A prefill server's answer names KV that is only good once saved.
            if seq.kv_transfer_params is not None and seq.request_id in self.scheduler.held:
                self.unanswered[seq.request_id] = output
            else:
                outputs.append(output)
        return outputs

    def record_step(self, started: float, num_computed: int, num_prefill: int) -> None:
        """A step's counts and its time since `started`, for stats and the step window."""
        self.stats.computed_tokens += num_computed
        step_seconds = time.perf_counter() - started
        self.last_step = StepTime(step_seconds, num_prefill, num_computed - num_prefill)
        self.step_window.add(self.last_step)

    def _answer_released(self, released: list[Sequence]) -> list[CoreOutput]:
        """The waiting answers of requests the connector released, with what it says."""
        answers = []
        for seq in released:
            if (output := self.unanswered.pop(seq.request_id, None)) is not None:
                answers.append(output._replace(kv_transfer_params=seq.kv_transfer_params))
        return answers

    def close(self) -> None:
        """Stops the threads of the KV connector and of async scheduling (the engine's
        other parts need nothing)."""
        if self.async_steps is not None:
            self.async_steps.close()
        if self.kv_connector is not None:
            self.kv_connector.close()

    def _propose(self, spec: Speculator) -> None:
        """Proposals for the next step, sized for what that step will compute anyway."""
        running = self.scheduler.running
        pending = sum(s.num_uncomputed_tokens for s in running if s.num_uncomputed_tokens > 1)
        pending += sum(s.num_tokens for s in self.scheduler.waiting)
        other = min(self.scheduler.max_num_batched_tokens, len(running) + pending)
        spec.propose(running, other, self._draft_generators)

    def _draft_generators(self, seq: Sequence, count: int) -> list[torch.Generator]:
        return self.runner.position_generators(seq, count, salt=1)

    def _forget(self, seq: Sequence) -> None:
        """Drops a finished request's engine-side state (the scheduler freed its blocks)."""
        if self.speculator is not None:
            self.speculator.release(seq.request_id)
        del self.sequences[seq.request_id]

    @staticmethod
    def _output(seq: Sequence, appended: int, now: float) -> CoreOutput:
        """The tokens seq kept this step, and its counters when they are news: with its
        first tokens (its queue and prefill are over) and when it finishes."""
        tokens = seq.token_ids
        finished = seq.status is Status.FINISHED
        metrics = None
        if finished or len(tokens) - seq.num_prompt_tokens == appended:
            metrics = replace(seq.metrics, token_times=[])
        new = tokens[len(tokens) - appended :]
        return CoreOutput(seq.request_id, new, finished, seq.finish_reason, now, metrics)

    def get_stats(self, window: bool = True) -> EngineStats:
        """The counters and gauges; with `window`, the last minute's steps too (the core
        process sends none: its client keeps its own window of the steps it reports)."""
        s = self.stats
        s.num_running = len(self.scheduler.running)
        s.num_waiting = len(self.scheduler.waiting)
        s.kv_cache_usage = self.block_manager.usage
        s.prefix_cache_queries = self.scheduler.prefix_cache_queries
        s.prefix_cache_hits = self.scheduler.prefix_cache_hits
        s.num_preemptions = self.scheduler.num_preemptions
        s.generation_tokens = self.scheduler.num_generated_tokens
        if self.kv_connector is not None:
            s.kv_transfer = self.kv_connector.stats
        if window:
            s.steps = self.step_window.stats()
        return s


def sync_only_because(config: EngineConfig) -> str | None:
    """Why the engine cannot schedule asynchronously with this config (None: it can).
    Speculation decides a step's proposals from the step before's accepted tokens, and a
    KV connector's saves and loads are timed around each step's forward: neither knows
    placeholders (docs/engine.md, "Async scheduling")."""
    if config.spec_method is not None:
        return f"speculative decoding ({config.spec_method}) needs each step's tokens first"
    if config.kv_store is not None:
        return "the KV store's saves and loads are timed around synchronous steps"
    return None


def kv_store_connector(
    config: EngineConfig,
    model: LoadedModel,
    attention: AttentionBackend,
    block_size: int,
    device: torch.device,
) -> KVConnector | None:
    """The KV store's connector that config asks for (None without kv_store): blocks are
    shared only with caches of the same layout (engine/kv_block_codec.py)."""
    if config.kv_store is None:
        return None
    cfg = model.config
    path = config.model_path
    size = path.stat().st_size if path.is_file() else 0
    layout = KVLayout(
        model=f"{path.name}:{size}:{config.dtype}:{config.quantization}",
        kv_dtype=config.kv_cache_dtype,
        attention_layout=attention.kv_layout,
        block_size=block_size,
        num_layers=cfg.num_layers,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        dtype_bytes=config.torch_kv_cache_dtype.itemsize,
    )
    return RedisKVStore(
        config.kv_store, config.kv_role, layout, ttl=config.kv_store_ttl, device=device
    )


def _without_password(url: str) -> str:
    """A Redis URL as logs may show it."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" if parts.username else f":***@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return parts._replace(netloc=netloc).geturl()
