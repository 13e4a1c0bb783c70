"""The engine's settings that a server's operator sets, declared once: each one's name,
type, default, help and choices. EngineConfig (engine/config.py) adds the rest and
resolves them; the gateway's settings, `semgate serve`'s flags and the settings table in
docs/gateway.md are made from this declaration. No torch here: `semgate serve --help`
and the gateway's settings read it before any model code loads."""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields
from typing import Any

DEFAULT_MODEL = "smollm2-135m-instruct"
QUANTIZATION_CHOICES = ("auto", "none", "int8", "int4")
KV_CACHE_DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
# engine/attention_backends.py's registry, and "auto" (tests/engine/test_options.py).
ATTENTION_BACKEND_CHOICES = ("auto", "flash", "cpu", "torch", "flash_reference")
SPEC_METHOD_CHOICES = ("ngram", "draft")
KV_ROLE_CHOICES = ("both", "prefill", "decode")


@dataclass(frozen=True)
class Option:
    """What a setting means to whoever sets it: `help` in a flag's words, `default_text`
    the default where its value says too little (None: the value itself)."""

    help: str
    default_text: str | None = None
    choices: tuple[str, ...] = ()
    share: bool = False  # a number in (0, 1]


def option(
    default: Any,
    help: str,
    *,
    default_text: str | None = None,
    choices: tuple[str, ...] = (),
    share: bool = False,
) -> Any:
    """A dataclass field that carries its Option."""
    return field(default=default, metadata={"option": Option(help, default_text, choices, share)})


def option_of(setting: Field[Any]) -> Option:
    """The Option of a dataclass field declared with option()."""
    return setting.metadata["option"]


def default_in_words(setting: Field[Any]) -> str:
    """A field's default as its help and docs say it."""
    text = option_of(setting).default_text
    if text is not None:
        return text
    if isinstance(setting.default, bool):
        return "on" if setting.default else "off"
    return "none" if setting.default is None else str(setting.default)


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """A readable error unless value is one of choices (settings check theirs at start)."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, not {value!r}")


@dataclass
class EngineOptions:
    """The engine's settings that `semgate serve` sets (EngineConfig: every setting)."""

    model: str = option(DEFAULT_MODEL, "bundled name, .gguf file or Hugging Face directory")
    max_model_len: int | None = option(None, "context length", default_text="the model's")
    max_num_seqs: int = option(64, "engine batch size: sequences that run at once")
    # Token budget of one step; default 64 on a CPU (2,048 on CUDA), or max_num_seqs
    # when that is larger (the decodes alone must fit). On 2 CPU cores a 64-token chunk
    # costs about as much as two decode steps, which keeps running streams smooth while
    # a long prompt is prefilled; raise it on bigger machines for throughput.
    max_num_batched_tokens: int | None = option(
        None,
        "token budget of one step",
        default_text="64 on CPU, 2048 on CUDA, or max_num_seqs if larger",
    )
    chunked_prefill: bool = option(True, "long prompts prefilled in chunks beside the decodes")
    prefix_caching: bool = option(True, "KV reused across requests that share a prefix")
    num_threads: int | None = option(None, "engine CPU threads", default_text="all cores")
    # "auto": int4 on CPU (the fastest mode that meets its quality goal, docs/engine.md),
    # none elsewhere; engine/quantized_linear.py.
    quantization: str | None = option(
        "auto",
        "weights of the linear layers",
        default_text="auto: int4 on CPU, none on CUDA",
        choices=QUANTIZATION_CHOICES,
    )
    attention_backend: str = option(
        "auto",
        "attention kernels; flash_reference is flash's contract in plain torch, for tests",
        default_text="auto: flash-attn-4 on an NVIDIA GPU, semgate's kernel on a CPU, else "
        "SDPA (torch)",
        choices=ATTENTION_BACKEND_CHOICES,
    )
    # vLLM's kv_cache_dtype. bfloat16 halves the cache's bytes, so a decode reads half and
    # the same memory holds twice the tokens, at no measured cost in perplexity
    # (docs/engine.md, "KV cache dtype"); attention still computes in float32. llama.cpp's
    # default cache is 16-bit too.
    kv_cache_dtype: str = option(
        "auto",
        "what the KV cache stores (bfloat16 halves its bytes)",
        default_text="auto: bfloat16 for a float32 model on CPU, else the model's dtype",
        choices=KV_CACHE_DTYPE_CHOICES,
    )
    # 16 on CPU (cpu, torch): small enough that little KV is wasted on short chat turns,
    # large enough that block tables and prefix hashes stay cheap. 128 for flash-attn-4,
    # which loads whole pages by TMA only when a page is one of its key tiles.
    block_size: int | None = option(
        None,
        "tokens a KV block holds",
        default_text="the attention backend's: 128 for flash, 16 for the others",
    )
    # KV cache size: kv_cache_memory bytes, else a share of free memory
    # (engine/kv_cache_size.py); EngineConfig.num_kv_blocks before both.
    kv_cache_memory: int | None = option(
        None,
        "bytes of KV cache",
        default_text="sized from the free memory; the start-up log says how much and why",
    )
    # On CPU: this share of available RAM (MemAvailable once the weights are loaded). A
    # tenth, so that ten engines started together (the test suite starts about ten), which
    # all see the same MemAvailable (the kernel commits a cache's pages only as they are
    # touched: allocate_kv_cache), fill at most that RAM between them. Blocks are reused
    # least recently freed first, so a long-running server does touch its whole cache in
    # time. 10% of the ~19 GiB available on a 24 GiB machine is ~1.9 GiB, ~2.7k blocks of
    # SmolLM2-135M in float32 (vLLM's CPU default: 4 GiB). A container's memory limit is
    # not seen: set kv_cache_memory there.
    kv_cache_memory_fraction: float = option(
        0.1, "share of the available RAM the KV cache takes on CPU", share=True
    )
    # On CUDA: vLLM's gpu_memory_utilization.
    gpu_memory_utilization: float = option(
        0.9,
        "share of the GPU's memory the engine may use, weights and activations included; "
        "the KV cache gets what is left of it",
        share=True,
    )
    # None: eager on a CPU (where the padded steps graphs need would only cost), graphs
    # on CUDA (engine/graph_runner.py).
    enforce_eager: bool | None = option(
        None, "no CUDA graphs: every step runs eagerly, unpadded", default_text="on CPU only"
    )
    # engine/async_step.py: the next step is scheduled and launched before this one's
    # outputs are processed. Off by default: on a CPU it measured slower, 0.69x the
    # throughput on one core (docs/engine.md, "Async scheduling"); not measured on a GPU
    # yet. Speculative decoding and kv_store turn it off.
    async_scheduling: bool = option(
        False,
        "schedule and launch the next step while this one's outputs are processed (same "
        "outputs); off with speculative decoding or a KV store",
        default_text="off (slower on a CPU; not measured on a GPU yet)",
    )
    # "ngram" (prompt lookup) or "draft" (a smaller model sharing the tokenizer; without
    # spec_draft_model, the target's own first EngineConfig.spec_draft_layers layers plus
    # its final norm and head).
    spec_method: str | None = option(
        None, "speculative decoding", default_text="off", choices=SPEC_METHOD_CHOICES
    )
    # The policy picks fewer where acceptance or the batch size make more not pay.
    num_spec_tokens: int = option(
        8, "the most tokens proposed for a sequence in one step (the policy may pick fewer)"
    )
    spec_draft_model: str | None = option(
        None, "draft model for spec_method draft", default_text="the target's own first layers"
    )

    # engine/kv_connector.py and engine/redis_kv_store.py: full KV blocks shared with other
    # engine servers (a replica, this one after a restart) through Redis, keyed as the
    # prefix cache names them, so a prompt another server computed is loaded, not computed.
    kv_store: str | None = option(
        None,
        "Redis URL (redis://HOST:PORT/DB, or redis+sentinel://HOST:PORT[,...]/SERVICE/DB) of "
        "a KV store that engine servers share",
    )
    # vLLM's kv_role: a prefill server saves what it computes, a decode server only loads
    # (saving would cost the decode steps P/D protects); both does both.
    kv_role: str = option(
        "both",
        "with kv_store: prefill saves and loads, decode only loads, both does both",
        choices=KV_ROLE_CHOICES,
    )
    kv_store_ttl: int | None = option(
        None,
        "seconds a block saved to the KV store lives",
        default_text="none: Redis's maxmemory policy evicts (docs/deploy.md)",
    )

    def __post_init__(self) -> None:
        """Checks what needs no model and no device: choices, counts and shares."""
        for setting in fields(EngineOptions):
            value, choices = getattr(self, setting.name), option_of(setting).choices
            if choices and value is not None:
                check_choice(setting.name, value, choices)
            if option_of(setting).share and not 0 < value <= 1:  # NaN fails too
                raise ValueError(f"{setting.name} must be in (0, 1], not {value!r}")
        for name in ("max_num_seqs", "num_spec_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("max_num_batched_tokens", "block_size", "kv_cache_memory", "kv_store_ttl"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.kv_store is not None:
            # Here, not at the top: redis-py takes ~0.1 s to import, and `--help` reads this.
            from resilience.redis_url import check_redis_url

            check_redis_url(self.kv_store, "kv_store")
            if not self.prefix_caching:
                raise ValueError("kv_store needs prefix_caching: blocks are keyed by its hashes")
        elif self.kv_role != "both":
            raise ValueError(f"kv_role {self.kv_role} needs a kv_store to save to or load from")

    def options(self) -> dict[str, Any]:
        """The values of these settings alone (without a subclass's own)."""
        return {setting.name: getattr(self, setting.name) for setting in fields(EngineOptions)}
