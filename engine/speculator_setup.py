"""The speculator an engine's config asks for (n-gram prompt lookup, or a draft model:
another model sharing the tokenizer, or the target's own first layers), built over the
engine's model runner. Outside engine/speculative/, whose proposers the runner imports:
building them needs the runner's caches and input batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.speculative.draft import DraftProposer
from engine.speculative.ngram import NgramProposer
from engine.speculative.speculator import Speculator

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.kv_cache import BlockManager
    from engine.metrics import EngineStats
    from engine.model import CausalLM
    from engine.model_runner import ModelRunner


def build_speculator(
    config: EngineConfig,
    model: CausalLM,
    runner: ModelRunner,
    block_manager: BlockManager,
    max_model_len: int,
    stats: EngineStats,
) -> Speculator | None:
    """The speculator the config asks for, None without speculation. A draft model's
    proposer is the speculator's `drafter`: its owner hands it to the runner, whose
    steps keep a separate draft's KV in step with the target's."""
    method = config.spec_method
    if method is None:
        return None
    common = (config.num_spec_tokens, block_manager, max_model_len, stats)
    if method == "ngram":
        ngram = NgramProposer(config.spec_ngram_min, config.spec_ngram_max)
        return Speculator(
            *common,
            ngram=ngram,
            description=(
                f"ngram n={config.spec_ngram_max}..{config.spec_ngram_min}, "
                f"up to {config.num_spec_tokens} tokens"
            ),
        )
    drafter = _drafter(config, model, runner, block_manager.num_blocks, max_model_len)
    name = config.spec_draft_path.name if config.spec_draft_path else "self-draft"
    return Speculator(
        *common,
        drafter=drafter,
        description=(
            f"draft {name}, {drafter.num_layers} layers, up to {config.num_spec_tokens} tokens"
        ),
    )


def _drafter(
    config: EngineConfig,
    model: CausalLM,
    runner: ModelRunner,
    num_blocks: int,
    max_model_len: int,
) -> DraftProposer:
    target = model.config
    if config.spec_draft_path is None:
        layers = config.spec_draft_layers or max(1, target.num_layers // 4)
        if layers >= target.num_layers:
            raise ValueError(
                f"spec_draft_layers must be under the target's {target.num_layers} layers"
            )
        # The first `layers` layers' KV is the target's own: share its cache.
        return DraftProposer(model, runner.kv_caches, layers, runner.inputs, True)
    from engine.loader import load_model_files
    from engine.model import CausalLM

    draft_cfg, weights, _ = load_model_files(config.spec_draft_path)
    if draft_cfg.vocab_size != target.vocab_size:
        raise ValueError(
            f"the draft model's vocabulary ({draft_cfg.vocab_size}) differs from the "
            f"target's ({target.vocab_size}): a draft must share the target's tokenizer"
        )
    draft = CausalLM(
        draft_cfg, weights, max_model_len, runner.device, config.torch_dtype, config.quantization
    )
    # The target's block ids and slots, its null block included.
    kv_caches = runner.attention.allocate_kv_cache(
        draft_cfg.num_layers,
        num_blocks + 1,
        runner.block_size,
        draft_cfg.num_kv_heads,
        draft_cfg.head_dim,
    )
    return DraftProposer(draft, kv_caches, draft_cfg.num_layers, runner.inputs, False)
