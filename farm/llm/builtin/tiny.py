"""A tiny random Llama model with a locally trained tokenizer: no download, deterministic per seed.

The folder it writes loads with ``AutoModelForCausalLM``/``AutoTokenizer`` and with vLLM. A Llama
config (not Qwen2) keeps the tokenizer we trained: with ``model_type: qwen2`` transformers swaps in
Qwen2Tokenizer, which re-applies its own pre-tokenizer and changes the ids. ``head_dim`` stays 64
because vLLM's CPU attention kernels support only a few head sizes.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

#: the corpus the tokenizer is trained on, shipped in farm/llm/builtin/data/.
CORPUS_RESOURCE = "corpus.txt"
DEFAULT_SEED = 0
DEFAULT_VOCAB_SIZE = 512
DEFAULT_MAX_POSITIONS = 2048
HIDDEN_SIZE = 128
HEAD_DIM = 64
NUM_LAYERS = 2
INTERMEDIATE_SIZE = 256

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
#: ChatML markers plus the tool-call markers a tool-using agent writes and reads.
SPECIAL_TOKENS = (
    PAD_TOKEN,
    "<|im_start|>",
    EOS_TOKEN,
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

# ChatML. Tool results are wrapped in <tool_response>, assistant tool calls in <tool_call> (JSON inside).
# Every message renders to the same string wherever it sits, so the template extends append-only.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'tool' -%}"
    "{{- '<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}"
    "{%- else -%}"
    "{{- message['content'] or '' -}}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' -}}"
    "{{- (fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def corpus_text() -> str:
    return resources.files("farm.llm.builtin.data").joinpath(CORPUS_RESOURCE).read_text(encoding="utf-8")


def _train_tokenizer(vocab_size: int, context: int) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_text().splitlines(keepends=True), trainer=trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=list(SPECIAL_TOKENS[3:]),
        chat_template=CHAT_TEMPLATE,
        model_max_length=context,
    )


def make_tiny(
    out_dir: Path,
    *,
    seed: int = DEFAULT_SEED,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    name: str = "farm-tiny",
    context: int = DEFAULT_MAX_POSITIONS,
    family: str | None = None,
    families_dir: Path | None = None,
) -> Path:
    """Build the tokenizer and a randomly initialised model and ``save_pretrained`` both into ``out_dir``.

    With ``family`` (a name in ``farm.llm.families.FAMILIES``) the model is instead a tiny random one of
    that real family, its tokenizer and chat template (``farm.llm.builtin.family_tiny``); ``vocab_size``
    and ``name`` then do not apply.

    Args:
        out_dir: folder to write (created if missing; existing files are overwritten).
        seed: seeds the weights; the tokenizer depends only on the shipped corpus.
        vocab_size: upper bound for the BPE vocabulary (the corpus may yield fewer tokens).
        name: recorded as ``_name_or_path`` in the config.
        context: the model's context length in tokens (an external harness's system prompt can be
            long: Claude Code's alone is many thousands of the tiny tokenizer's tokens).
        family: build a tiny model of this real family instead of the farm's own.
        families_dir: the cache scripts/setup_families.sh filled (default: ``DEFAULT_CACHE_DIR``).

    Returns:
        ``out_dir``.

    Raises:
        OSError: the folder cannot be written.
        FamiliesMissing: ``family`` is given and the families cache is not set up.
        KeyError: ``family`` is no known family.
    """
    if family is not None:
        from farm.llm.builtin.family_tiny import make_family_tiny
        from farm.llm.families import DEFAULT_CACHE_DIR

        return make_family_tiny(
            out_dir, family=family, cache_dir=families_dir or DEFAULT_CACHE_DIR, seed=seed, context=context
        )
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tokenizer(vocab_size, context)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)  # type: ignore[attr-defined]
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)  # type: ignore[attr-defined]
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=HIDDEN_SIZE // HEAD_DIM,
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        max_position_embeddings=context,
        # Untied: vLLM 0.32's in-place reload (/collective_rpc reload_weights) leaves a tied output
        # embedding on the old weights ("ParallelLMHead: Failed to load weights"), and the weight
        # update tests load new weights into vLLM and the built-in backend alike.
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    config._name_or_path = name
    torch.manual_seed(seed)
    # A random init with std 0.02 gives almost uniform next-token distributions; a larger std gives
    # the sampler something to choose between, which makes sampling bugs visible in tests.
    config.initializer_range = 0.2
    model = LlamaForCausalLM(config).eval()  # type: ignore[no-untyped-call]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config.do_sample = True
    from transformers.utils import logging as hf_logging

    # A shard progress bar for a 1.4 MB model is only noise in `farm up`.
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)  # type: ignore[attr-defined]
    return out_dir
