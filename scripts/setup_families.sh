#!/usr/bin/env bash
# Fetch the real model families' vocabularies and chat templates (farm/llm/families.py) once per machine:
# the llama-cpp-python source distribution on PyPI vendors llama.cpp's test data. Only its
# vendor/llama.cpp/models/ggml-vocab-*.gguf (+ .inp/.out test vectors) of the families' vocabularies and
# models/templates/*.jinja are extracted; the 77 MB archive stays in the cache, nothing is committed.
#
#   scripts/setup_families.sh [CACHE_DIR]   default: $FARM_FAMILIES_DIR or ~/.cache/rollout-farm/families
#
# Idempotent: returns at once when the cache is complete. Cold: 2-5 min on 2 cores (pip unpacks the
# sdist and prepares its metadata before it saves it).
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.3.36
cache="${1:-${FARM_FAMILIES_DIR:-$HOME/.cache/rollout-farm/families}}"
# The vocabularies farm/llm/families.py names (several families share one).
vocabs=(qwen2 qwen35 llama-bpe phi-3)

if [[ -f "$cache/.ready" ]] && [[ "$(cat "$cache/.ready")" == "$version" ]]; then
    echo "model families already present: $cache"
    exit 0
fi

mkdir -p "$cache"
sdist="$cache/llama_cpp_python-$version.tar.gz"
if [[ ! -s "$sdist" ]]; then
    . scripts/python.sh
    tmp=$(mktemp -d "$cache/download.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$tmp"
    mv "$tmp/llama_cpp_python-$version.tar.gz" "$sdist"
fi

models="llama_cpp_python-$version/vendor/llama.cpp/models"
patterns=("$models/templates/*.jinja")
for vocab in "${vocabs[@]}"; do
    patterns+=("$models/ggml-vocab-$vocab.gguf" "$models/ggml-vocab-$vocab.gguf.inp" "$models/ggml-vocab-$vocab.gguf.out")
done
work=$(mktemp -d "$cache/extract.XXXXXX")
tar xzf "$sdist" -C "$work" --wildcards "${patterns[@]}"
rm -rf "$cache/vocab" "$cache/templates"
mkdir -p "$cache/vocab"
mv "$work/$models"/ggml-vocab-* "$cache/vocab/"
mv "$work/$models/templates" "$cache/templates"
rm -rf "$work"
echo "$version" >"$cache/.ready"
echo "model families ready: $cache ($(du -sh "$cache" | cut -f1))"
