#!/usr/bin/env bash
# Build the virtual environment the opt-in Harbor agreement test uses (the `harbor` package needs
# Python >= 3.12; the farm runs on 3.11).
#
#   scripts/setup_harbor.sh [VENV_DIR]       default: .venv-harbor (or $FARM_HARBOR_VENV)
#
# Takes ~1-2 minutes. Then run: python -m pytest --run-images tests/tasks/harbor/test_harbor_package.py
set -euo pipefail

venv="${1:-${FARM_HARBOR_VENV:-.venv-harbor}}"
python="${PYTHON312:-}"
if [[ -z "$python" ]]; then
    # pyenv's shims answer only for the versions it has selected: its other versions by their path.
    pyenv_versions=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")/versions
    for candidate in python3.13 python3.12 "$pyenv_versions"/3.1[2-9]*/bin/python3; do
        if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
            python="$candidate"
            break
        fi
    done
fi
if [[ -z "$python" ]]; then
    echo "no Python >= 3.12 found (set PYTHON312): the harbor environment cannot be built" >&2
    exit 1
fi
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import harbor.models.task.task" 2>/dev/null; then
    echo "harbor environment already present: $venv"
    exit 0
fi
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet 'harbor==0.25.0'
"$venv/bin/python" -c "import harbor.models.task.task; print('harbor ready')"
echo "harbor environment ready: $venv"
