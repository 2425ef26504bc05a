"""Real model families as offline fixtures: each one's vocabulary, chat template, added tokens and parsers.

The vocabularies and templates are llama.cpp's test data, vendored in the ``llama-cpp-python`` source
distribution on PyPI; ``scripts/setup_families.sh`` downloads it once into a cache folder and extracts
``vocab/ggml-vocab-*.gguf`` (with the ``.inp``/``.out`` tokenization test vectors) and
``templates/*.jinja`` there. Nothing here is committed or fetched at run time.

A family is what a trainer names when it picks a model: the vocabulary (several families share one),
the added tokens at the ids the real model publishes, the published chat template, the Hugging Face
architecture, and the tool-call and reasoning parsers vLLM serves it with, under vLLM's names.
``farm.llm.builtin.family_tiny`` builds a tiny random model of a family from this description.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the source distribution whose vendored llama.cpp test data the families come from.
SDIST_PACKAGE = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
#: where scripts/setup_families.sh puts it (its FARM_FAMILIES_DIR overrides this, as do the entry points).
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "rollout-farm" / "families"
#: written last by the setup script: its presence means the extraction is complete.
READY_MARKER = ".ready"
#: separates two inputs in a ``.inp`` file (llama.cpp tests/test-tokenizer-0); ``.out`` has one line per input.
TEST_SEPARATOR = "\n__ggml_vocab_test__\n"


@dataclass(frozen=True)
class AddedToken:
    """A token placed at a fixed id over the vocabulary (replacing whatever the GGUF holds there)."""

    id: int
    content: str
    #: special tokens are dropped by ``decode(skip_special_tokens=True)``; Qwen's tool and think markers are not.
    special: bool = True


@dataclass(frozen=True)
class Family:
    """One model family: where its tokenizer and template come from and how vLLM serves it."""

    name: str
    #: ``ggml-vocab-<vocab>.gguf`` in the cache's ``vocab/`` folder.
    vocab: str
    #: file name in the cache's ``templates/`` folder.
    template: str
    #: the Hugging Face architecture class of the real checkpoints' language model.
    architecture: str
    #: the real model's vocabulary size (embedding rows), which may exceed the GGUF's token count.
    vocab_size: int
    added_tokens: tuple[AddedToken, ...]
    eos_token: str
    pad_token: str | None
    bos_token: str | None = None
    #: the tokenizer prepends ``bos_token`` when asked for special tokens (not within chat templates).
    add_bos: bool = False
    #: extra end-of-turn ids the real generation_config lists besides ``eos_token``.
    extra_eos: tuple[str, ...] = ()
    #: vLLM's ``--tool-call-parser`` name; None where vLLM has none that fits the family.
    tool_call_parser: str | None = None
    #: vLLM's ``--reasoning-parser`` name; None for a model that does not think.
    reasoning_parser: str | None = None
    #: chat-template kwargs the built-in agent loop renders with, so the template prompts as the
    #: published one does (llama.cpp's DeepSeek-R1 copy opens <think> only with enable_thinking).
    template_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)
    #: where the tokens, the template and the parsers were checked, and what differs from the real model.
    notes: str = ""
    #: the transformers tokenizer class recorded in tokenizer_config.json.
    tokenizer_class: str = "PreTrainedTokenizerFast"
    #: fixes of the GGUF-derived tokenizer.json that the published tokenizer.json has (see family_tiny).
    tokenizer_fixes: tuple[str, ...] = field(default=())

    def token_id(self, content: str) -> int:
        """The id of one of the family's added tokens (the tokenizer places each at its id).

        Raises:
            KeyError: ``content`` is not one of them.
        """
        for token in self.added_tokens:
            if token.content == content:
                return token.id
        raise KeyError(f"{content!r} is not an added token of {self.name}")


def _qwen_tokens(offset: int = 0, *, thinking: bool = True) -> tuple[AddedToken, ...]:
    # Qwen2.5's added tokens from 151643; Qwen3 appends <tool_response> and <think> (151665-151668).
    names = [
        ("<|endoftext|>", True),
        ("<|im_start|>", True),
        ("<|im_end|>", True),
        ("<|object_ref_start|>", True),
        ("<|object_ref_end|>", True),
        ("<|box_start|>", True),
        ("<|box_end|>", True),
        ("<|quad_start|>", True),
        ("<|quad_end|>", True),
        ("<|vision_start|>", True),
        ("<|vision_end|>", True),
        ("<|vision_pad|>", True),
        ("<|image_pad|>", True),
        ("<|video_pad|>", True),
        ("<tool_call>", False),
        ("</tool_call>", False),
        ("<|fim_prefix|>", False),
        ("<|fim_middle|>", False),
        ("<|fim_suffix|>", False),
        ("<|fim_pad|>", False),
        ("<|repo_name|>", False),
        ("<|file_sep|>", False),
    ]
    if thinking:
        names += [("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False)]
    return tuple(AddedToken(151643 + offset + i, content, special) for i, (content, special) in enumerate(names))


def _deepseek_r1_qwen_tokens() -> tuple[AddedToken, ...]:
    # The distill replaced Qwen's first seven added tokens with DeepSeek's markers and kept the rest.
    deepseek = [
        ("<｜end▁of▁sentence｜>", True),
        ("<｜User｜>", False),
        ("<｜Assistant｜>", False),
        ("<｜begin▁of▁sentence｜>", True),
        ("<|EOT|>", False),
        ("<think>", False),
        ("</think>", False),
    ]
    head = tuple(AddedToken(151643 + i, content, special) for i, (content, special) in enumerate(deepseek))
    return head + _qwen_tokens(thinking=False)[7:]


def _llama31_tokens() -> tuple[AddedToken, ...]:
    named = {
        128000: "<|begin_of_text|>",
        128001: "<|end_of_text|>",
        128002: "<|reserved_special_token_0|>",
        128003: "<|reserved_special_token_1|>",
        128004: "<|finetune_right_pad_id|>",
        128005: "<|reserved_special_token_2|>",
        128006: "<|start_header_id|>",
        128007: "<|end_header_id|>",
        128008: "<|eom_id|>",
        128009: "<|eot_id|>",
        128010: "<|python_tag|>",
    }
    # Llama 3.1 renumbered the reserved tokens after it named 128004, 128008 and 128010.
    named.update({i: f"<|reserved_special_token_{i - 128008}|>" for i in range(128011, 128256)})
    return tuple(AddedToken(i, content) for i, content in sorted(named.items()))


_QWEN3_NOTES = (
    "Added-token ids: Qwen3-4B's tokenizer_config.json (Qwen3-0.6B's is the same list) and torchtune's "
    "QWEN3_SPECIAL_TOKENS; vocabulary: llama.cpp's qwen2 test vocabulary (Qwen2/2.5/3 share the BPE ranks)."
)

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family(
            name="qwen2.5",
            vocab="qwen2",
            template="Qwen-Qwen2.5-7B-Instruct.jinja",
            architecture="Qwen2ForCausalLM",
            vocab_size=151936,
            added_tokens=_qwen_tokens(thinking=False),
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            extra_eos=("<|endoftext|>",),
            tool_call_parser="hermes",
            notes="Added-token ids: torchtune's QWEN2_5_SPECIAL_TOKENS (151643-151664).",
            tokenizer_class="Qwen2Tokenizer",
        ),
        Family(
            name="qwen3",
            vocab="qwen2",
            template="Qwen-Qwen3-0.6B.jinja",
            architecture="Qwen3ForCausalLM",
            vocab_size=151936,
            added_tokens=_qwen_tokens(),
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            extra_eos=("<|endoftext|>",),
            tool_call_parser="hermes",
            reasoning_parser="qwen3",
            notes=_QWEN3_NOTES,
            tokenizer_class="Qwen2Tokenizer",
        ),
        Family(
            name="qwen3-coder",
            vocab="qwen2",
            template="Qwen3-Coder.jinja",
            # Qwen3-Coder-30B-A3B and -480B-A35B are mixtures of experts.
            architecture="Qwen3MoeForCausalLM",
            vocab_size=151936,
            added_tokens=_qwen_tokens(),
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            extra_eos=("<|endoftext|>",),
            tool_call_parser="qwen3_coder",
            notes=_QWEN3_NOTES + " Qwen3-Coder does not think: no reasoning parser.",
            tokenizer_class="Qwen2Tokenizer",
        ),
        Family(
            name="llama3",
            vocab="llama-bpe",
            template="meta-llama-Llama-3.1-8B-Instruct.jinja",
            architecture="LlamaForCausalLM",
            vocab_size=128256,
            added_tokens=_llama31_tokens(),
            bos_token="<|begin_of_text|>",
            add_bos=True,
            eos_token="<|eot_id|>",
            pad_token=None,
            extra_eos=("<|end_of_text|>", "<|eom_id|>"),
            tool_call_parser="llama3_json",
            notes=(
                "Llama 3.1/3.3 special tokens 128000-128010 (torchtune's llama3 SPECIAL_TOKENS); the test "
                "vocabulary is Llama 3's, whose 128004/128008/128010 3.1 renamed."
            ),
            tokenizer_fixes=("ignore_merges",),
        ),
        Family(
            name="deepseek-r1",
            vocab="qwen2",
            template="deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
            architecture="Qwen2ForCausalLM",
            vocab_size=151936,
            added_tokens=_deepseek_r1_qwen_tokens(),
            bos_token="<｜begin▁of▁sentence｜>",
            add_bos=True,
            eos_token="<｜end▁of▁sentence｜>",
            pad_token="<｜end▁of▁sentence｜>",
            reasoning_parser="deepseek_r1",
            template_kwargs={"enable_thinking": True},
            notes=(
                "DeepSeek-R1-Distill-Qwen-1.5B's tokenizer.json (151643-151664). Its template writes "
                "DeepSeek-V3 tool calls (<｜tool▁calls▁begin｜>...), which are no tokens of the distill's "
                "vocabulary: vLLM's deepseek_v3 parser refuses such a tokenizer, so no tool parser. "
                "llama.cpp's copy of the template closes <think> in the generation prompt unless "
                "enable_thinking is true (the published one always leaves it open)."
            ),
        ),
        Family(
            name="qwen3.5",
            vocab="qwen35",
            template="Qwen3.5-4B.jinja",
            architecture="Qwen3_5ForCausalLM",
            vocab_size=248320,
            added_tokens=_qwen_tokens(offset=248044 - 151643),
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            extra_eos=("<|endoftext|>",),
            tool_call_parser="qwen3_coder",
            reasoning_parser="qwen3",
            notes=(
                "Qwen3.5 moved Qwen3's added tokens up by 96401 (vocab 248320): <|endoftext|> 248044, "
                "<|im_start|> 248045, <|im_end|> 248046, <think> 248068, </think> 248069 and the vision "
                "tokens 248053-248057 are published; the tool tokens are the same shift. llama.cpp's qwen35 "
                "test vocabulary is Qwen2's BPE ranks under Qwen3.5's pre-tokenizer (combining marks join "
                "letters, no NFC), so ordinary text ids differ from the real Qwen3.5's. The real checkpoints "
                "are Qwen3_5ForConditionalGeneration with linear-attention layers; the tiny model is its "
                "language model with full-attention layers only."
            ),
            # Not Qwen2Tokenizer, which normalizes to NFC: Qwen3.5 keeps combining marks as they come
            # (llama.cpp's vectors split "e\u0301" into e + U+0301); the GGUF's pre-tokenizer is Qwen3.5's.
            tokenizer_class="PreTrainedTokenizerFast",
        ),
        Family(
            name="phi-3",
            vocab="phi-3",
            template="microsoft-Phi-3.5-mini-instruct.jinja",
            architecture="Phi3ForCausalLM",
            vocab_size=32064,
            # The GGUF already names them; listed so the tests pin their ids.
            added_tokens=(
                AddedToken(1, "<s>"),
                AddedToken(32000, "<|endoftext|>"),
                AddedToken(32001, "<|assistant|>"),
                AddedToken(32006, "<|system|>"),
                AddedToken(32007, "<|end|>"),
                AddedToken(32010, "<|user|>"),
            ),
            bos_token="<s>",
            add_bos=True,
            eos_token="<|endoftext|>",
            pad_token="<|endoftext|>",
            extra_eos=("<|end|>", "<|assistant|>"),
            notes="Phi-3.5-mini-instruct: no tool-call or reasoning format vLLM parses.",
        ),
    )
}


def get_family(name: str) -> Family:
    """The family called ``name``.

    Raises:
        KeyError: no such family; the message lists the known ones.
    """
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}") from None


def vocab_path(cache_dir: Path, family: Family) -> Path:
    return Path(cache_dir) / "vocab" / f"ggml-vocab-{family.vocab}.gguf"


def template_path(cache_dir: Path, family: Family) -> Path:
    return Path(cache_dir) / "templates" / family.template


def is_ready(cache_dir: Path) -> bool:
    """True once scripts/setup_families.sh has extracted everything into ``cache_dir``."""
    return (Path(cache_dir) / READY_MARKER).is_file()


def tokenizer_test_vectors(cache_dir: Path, family: Family) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenization test vectors for the family's vocabulary: (text, ids without BOS)."""
    gguf = vocab_path(cache_dir, family)
    texts = Path(f"{gguf}.inp").read_text(encoding="utf-8").split(TEST_SEPARATOR)
    # The file ends with a separator: the last piece is empty and no input.
    texts = texts[:-1] if texts and texts[-1] == "" else texts
    lines = Path(f"{gguf}.out").read_text(encoding="utf-8").split("\n")
    return [(text, [int(x) for x in lines[i].split()]) for i, text in enumerate(texts)]
