#!/usr/bin/env bash
# Install TRL (1.16, trl.experimental.async_grpo) into the farm's own environment for the opt-in TRL
# test (--run-trl) and examples/trl_grpo_cpu.py. TRL's pins fit the farm's (transformers >= 4.56,
# accelerate, datasets), so unlike verl it needs no environment of its own.
#
#   scripts/setup_trl.sh          into .venv (or the active venv, or $PYTHON: see scripts/python.sh)
#
# Takes ~20 s. Then run: python -m pytest --run-trl tests/integration/test_trl_bridge.py
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/python.sh

if "$PYTHON" -c "import trl, sys; sys.exit(trl.__version__ != '1.16.0')" 2>/dev/null; then
    echo "TRL already installed in $PYTHON"
    exit 0
fi
# torch pinned: a looser spec pulls the registry's newest CUDA build (GBs) instead of the CPU wheel.
"$PYTHON" -m pip install -q 'torch==2.13.0' 'trl==1.16.0'   # the `trl` extra of pyproject.toml
"$PYTHON" -c "import trl.experimental.async_grpo, trl; print('trl', trl.__version__)"
