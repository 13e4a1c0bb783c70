"""Tokenizer and chat template: `tokenizers` for the text, jinja2 for the template."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

# llama.cpp names its pre-tokenizer regexes; these are the byte-level ones we accept.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_GGUF_TOKEN_CONTROL = 3
_GGUF_TOKEN_USER_DEFINED = 4


def _byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("default", "gpt-2", "gpt2"):
        return byte_level
    if pre == "smollm":  # GPT-2's regex after splitting every digit on its own
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    split = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}.get(pre)
    if split is None:
        raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}")
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


class Tokenizer:
    """Text <-> token ids, special tokens, and the model's chat template."""

    def __init__(
        self,
        backend: HFTokenizer,
        *,
        eos_token_ids: Sequence[int],
        bos_token_id: int | None,
        add_bos_token: bool,
        chat_template: str | None,
    ) -> None:
        self.backend = backend
        self.eos_token_ids = frozenset(eos_token_ids)
        self.bos_token_id = bos_token_id
        self.add_bos_token = add_bos_token and bos_token_id is not None
        self.chat_template = chat_template
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        # No token decodes to more characters than its vocabulary string has (a
        # byte-level symbol is one byte, a metaspace one character): a text of c
        # characters takes at least c / max_token_chars tokens, known without tokenizing.
        self.max_token_chars = max(len(token) for token in backend.get_vocab())
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent)
        env.globals["raise_exception"] = _raise_template_error
        self._template = env.from_string(chat_template) if chat_template else None

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> Tokenizer:
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"unsupported GGUF tokenizer {kind!r} (byte-level BPE 'gpt2' only)")
        tokens: list[str] = meta["tokenizer.ggml.tokens"]
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        backend = HFTokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=False))
        backend.pre_tokenizer = _byte_level_pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
        backend.decoder = decoders.ByteLevel()
        types = meta.get("tokenizer.ggml.token_type", [])
        backend.add_tokens(
            [
                AddedToken(tokens[i], special=(t == _GGUF_TOKEN_CONTROL), normalized=False)
                for i, t in enumerate(types)
                if t in (_GGUF_TOKEN_CONTROL, _GGUF_TOKEN_USER_DEFINED)
            ]
        )
        eos = meta.get("tokenizer.ggml.eos_token_id")
        eot = meta.get("tokenizer.ggml.eot_token_id")
        return cls(
            backend,
            eos_token_ids=[t for t in (eos, eot) if t is not None],
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=meta.get("tokenizer.chat_template"),
        )

    @classmethod
    def from_hf_dir(cls, path: Path, eos_token_ids: Sequence[int]) -> Tokenizer:
        backend = HFTokenizer.from_file(str(path / "tokenizer.json"))
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        template = cfg.get("chat_template")
        template_file = path / "chat_template.jinja"
        if template is None and template_file.is_file():
            template = template_file.read_text()
        bos = cfg.get("bos_token")
        bos = bos.get("content") if isinstance(bos, dict) else bos
        eos = cfg.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        eos_ids = list(eos_token_ids)
        if eos is not None and (eos_id := backend.token_to_id(eos)) is not None:
            eos_ids.append(eos_id)
        # Tokenizers whose post-processor adds BOS already do it in encode().
        return cls(
            backend,
            eos_token_ids=eos_ids,
            bos_token_id=backend.token_to_id(bos) if bos else None,
            add_bos_token=False,
            chat_template=template,
        )

    def min_tokens(self, num_chars: int) -> int:
        """A lower bound on the tokens of any text of num_chars characters."""
        return -(-num_chars // self.max_token_chars)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; without special tokens (no BOS) for text that continues
        a sequence, such as an answer."""
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if not add_special_tokens:
            return ids
        if self.add_bos_token and (not ids or ids[0] != self.bos_token_id):
            assert self.bos_token_id is not None  # add_bos_token is only set with an id
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        if self._template is None:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        bos = self.token_text(self.bos_token_id) if self.bos_token_id is not None else ""
        eos = self.token_text(min(self.eos_token_ids)) if self.eos_token_ids else ""
        return self._template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=bos,
            eos_token=eos,
        )


def _raise_template_error(message: str) -> None:
    raise ValueError(f"chat template: {message}")
