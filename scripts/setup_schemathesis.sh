#!/usr/bin/env bash
# Build the virtual environment the opt-in fuzz test uses (schemathesis pins its own hypothesis,
# starlette-testclient and friends, so it does not share the farm's environment).
#
#   scripts/setup_schemathesis.sh [VENV_DIR]     default: .venv-schemathesis (or $FARM_SCHEMATHESIS_VENV)
#
# Takes ~20 s. Then run: python -m pytest -m fuzz --run-fuzz tests/integration/test_fuzz.py
set -euo pipefail

venv="${1:-${FARM_SCHEMATHESIS_VENV:-.venv-schemathesis}}"
python="${PYTHON:-python3}"
version="4.32.5"

if [[ -x "$venv/bin/schemathesis" ]] && "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "$version"; then
    echo "schemathesis environment already present: $venv"
    exit 0
fi

"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet "schemathesis==$version"
"$venv/bin/schemathesis" --version
echo "schemathesis environment ready: $venv"
