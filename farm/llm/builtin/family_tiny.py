"""A tiny random model of a real family (``farm.llm.families``): its tokenizer, added tokens, chat template
and architecture, with weights small enough for a CPU.

The tokenizer comes from the family's GGUF vocabulary (transformers reads it with the ``gguf``
package, ~30 s for 150k tokens), then is edited as the published tokenizer.json is: the family's
added tokens are placed at their real ids (over the GGUF's ``[PAD151657]``-style placeholders), the
vocabulary is padded to the real model's size, and the fixes the GGUF conversion loses are put back.
Both steps are cached under the families cache folder (``tokenizers/``), so a machine pays the parse
once per vocabulary. ``head_dim`` stays 64 for vLLM's CPU attention kernels; the embeddings are tied,
which keeps a 150k-row vocabulary at one matrix.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from farm.errors import FamiliesMissing
from farm.llm.families import Family, get_family, is_ready, template_path, vocab_path

HIDDEN_SIZE = 64
HEAD_DIM = 64
NUM_LAYERS = 2
INTERMEDIATE_SIZE = 128
#: Qwen3-MoE (qwen3-coder): experts per layer and experts per token.
NUM_EXPERTS = 4
EXPERTS_PER_TOKEN = 2
DEFAULT_CONTEXT = 4096
#: bumped when the edits below change, so a cached tokenizer of an older recipe is rebuilt.
TOKENIZER_RECIPE = "5"

#: transformers model_type of each architecture the families use.
MODEL_TYPES = {
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "LlamaForCausalLM": "llama",
    "Phi3ForCausalLM": "phi3",
    "Qwen3_5ForCausalLM": "qwen3_5_text",
}


def _require_cache(cache_dir: Path) -> None:
    if not is_ready(cache_dir):
        raise FamiliesMissing(
            f"the model families cache {cache_dir} is not set up: run scripts/setup_families.sh "
            "(downloads llama-cpp-python's source distribution from PyPI once)"
        )


def _atomic_dir(target: Path, fill: Any) -> Path:
    """Fill a temporary sibling folder and rename it to ``target``: a reader never sees half a cache entry."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        fill(tmp)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def gguf_tokenizer_json(cache_dir: Path, family: Family) -> Path:
    """The tokenizer.json transformers makes of the family's GGUF vocabulary, parsed once per machine."""
    target = Path(cache_dir) / "tokenizers" / f"gguf-{family.vocab}"
    if (target / "tokenizer.json").is_file():
        return target / "tokenizer.json"
    _require_cache(cache_dir)
    from transformers import AutoTokenizer

    gguf = vocab_path(cache_dir, family)
    tokenizer: Any = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _atomic_dir(target, tokenizer.save_pretrained)
    return target / "tokenizer.json"


def _place_tokens(spec: dict[str, Any], family: Family) -> None:
    """Put the family's added tokens at their ids and pad the vocabulary to the real model's size."""
    vocab: dict[str, int] = spec["model"]["vocab"]
    by_id = {i: content for content, i in vocab.items()}
    # transformers invents tokens the GGUF lacks (a pad token past the end for llama-bpe): not the model's.
    added = {entry["id"]: entry for entry in spec["added_tokens"] if entry["id"] in by_id}
    # Rows the real model has past the GGUF's tokens: placeholders named and added as the GGUF names its
    # own, so a sampled one decodes to text that encodes back to it.
    for i in range(len(by_id), family.vocab_size):
        by_id[i] = f"[PAD{i}]"
        added[i] = {"id": i, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
    by_content = {content: i for i, content in by_id.items()}
    special: dict[int, bool] = {}
    for token in family.added_tokens:
        old = by_content.get(token.content)
        if old is not None and old != token.id:  # Qwen3.5 moved <|im_start|> & co. from 151643 up
            by_id[old] = f"[PAD{old}]"
            by_content[by_id[old]] = old
            special[old] = False
        by_content.pop(by_id[token.id], None)
        by_id[token.id] = token.content
        by_content[token.content] = token.id
        special[token.id] = token.special
    spec["model"]["vocab"] = {content: i for i, content in sorted(by_id.items())}
    entries = []
    for i in sorted(set(added) | set(special)):
        entry = dict(added.get(i) or {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False})
        entry.update(id=i, content=by_id[i], special=special.get(i, entry.get("special", False)))
        entries.append(entry)
    spec["added_tokens"] = entries


def _fix(spec: dict[str, Any], family: Family) -> None:
    """What the published tokenizer.json has and the GGUF conversion drops."""
    if family.vocab == "qwen2":  # Qwen2.5, Qwen3 and the DeepSeek distill publish NFC
        spec["normalizer"] = {"type": "NFC"}
    if "ignore_merges" in family.tokenizer_fixes:
        # Llama 3: a pre-token that is itself a vocabulary entry is taken whole ("Việt" is one id).
        spec["model"]["ignore_merges"] = True
    if family.add_bos and family.bos_token is not None:
        bos = {"id": family.bos_token, "type_id": 0}
        spec["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"SpecialToken": bos},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": family.bos_token, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {
                family.bos_token: {
                    "id": family.bos_token,
                    "ids": [spec["model"]["vocab"][family.bos_token]],
                    "tokens": [family.bos_token],
                }
            },
        }
    else:
        spec["post_processor"] = None


def family_tokenizer_dir(family_name: str, cache_dir: Path) -> Path:
    """A folder holding the family's tokenizer (tokenizer.json, tokenizer_config.json, chat template).

    Cached under ``cache_dir/tokenizers/<family>``; built from the GGUF vocabulary on first use.

    Raises:
        FamiliesMissing: scripts/setup_families.sh has not filled ``cache_dir``.
        KeyError: no such family.
    """
    family = get_family(family_name)
    cache_dir = Path(cache_dir)
    target = cache_dir / "tokenizers" / family.name
    stamp = target / "recipe"
    if stamp.is_file() and stamp.read_text() == TOKENIZER_RECIPE:
        return target
    _require_cache(cache_dir)
    spec = json.loads(gguf_tokenizer_json(cache_dir, family).read_text(encoding="utf-8"))
    _place_tokens(spec, family)
    _fix(spec, family)
    template = template_path(cache_dir, family).read_text(encoding="utf-8")

    def fill(folder: Path) -> None:
        from transformers import PreTrainedTokenizerFast

        (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
        tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_file=str(folder / "tokenizer.json"),
            bos_token=family.bos_token,
            eos_token=family.eos_token,
            pad_token=family.pad_token,
            chat_template=template,
        )
        tokenizer.save_pretrained(folder)
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config.update(tokenizer_class=family.tokenizer_class, add_bos_token=family.add_bos)
        # Explicitly none: transformers may pick the model type's class (Qwen2Tokenizer for the
        # DeepSeek distill), whose default unk "<|endoftext|>" it would append past the vocabulary.
        config.setdefault("unk_token", None)
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
        (folder / "recipe").write_text(TOKENIZER_RECIPE)

    return _atomic_dir(target, fill)


def _model_config(family: Family, context: int) -> Any:
    from transformers import AutoConfig

    ids = family.token_id
    common: dict[str, Any] = {
        "vocab_size": family.vocab_size,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": HIDDEN_SIZE // HEAD_DIM,
        "num_key_value_heads": 1,
        "max_position_embeddings": context,
        "tie_word_embeddings": True,
        "bos_token_id": ids(family.bos_token) if family.bos_token else None,
        "eos_token_id": ids(family.eos_token),
        "pad_token_id": ids(family.pad_token) if family.pad_token else None,
        # As in tiny.py: a wider init than 0.02 gives the sampler distributions worth telling apart.
        "initializer_range": 0.2,
        "dtype": "float32",
    }
    model_type = MODEL_TYPES[family.architecture]
    if model_type != "phi3":  # Phi-3 derives head_dim from hidden_size / heads
        common["head_dim"] = HEAD_DIM
    if model_type == "qwen3_moe":
        common.update(
            num_experts=NUM_EXPERTS,
            num_experts_per_tok=EXPERTS_PER_TOKEN,
            moe_intermediate_size=INTERMEDIATE_SIZE,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if model_type == "qwen3_5_text":
        # Full attention only: the built-in backend keeps per-sequence KV, not linear-attention state.
        common.update(layer_types=["full_attention"] * NUM_LAYERS)
    return AutoConfig.for_model(model_type, **common)


def make_family_tiny(
    out_dir: Path,
    *,
    family: str,
    cache_dir: Path,
    seed: int = 0,
    context: int = DEFAULT_CONTEXT,
) -> Path:
    """Write a tiny random model of ``family`` with its real tokenizer and chat template into ``out_dir``.

    Args:
        out_dir: folder to write (created if missing; existing files are overwritten).
        family: a name in ``farm.llm.families.FAMILIES`` (qwen3, llama3, ...).
        cache_dir: the families cache scripts/setup_families.sh filled.
        seed: seeds the weights; the tokenizer depends only on the family.
        context: the model's context length in tokens.

    Returns:
        ``out_dir``.

    Raises:
        FamiliesMissing: the cache is not set up.
        KeyError: no such family.
        OSError: the folder cannot be written.
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    spec = get_family(family)
    tokenizer_dir = family_tokenizer_dir(family, cache_dir)
    config = _model_config(spec, context)
    config._name_or_path = f"farm-tiny-{spec.name}"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()  # type: ignore[no-untyped-call]
    if type(model).__name__ != spec.architecture:
        raise RuntimeError(f"{spec.name}: transformers built {type(model).__name__}, not {spec.architecture}")
    model.generation_config.do_sample = True
    model.generation_config.eos_token_id = [spec.token_id(t) for t in (spec.eos_token, *spec.extra_eos)]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model.save_pretrained(out_dir)
    for path in tokenizer_dir.iterdir():
        if path.is_file() and path.name != "recipe":
            shutil.copyfile(path, out_dir / path.name)
    return out_dir
