#!/usr/bin/env bash
# Set up a virtual environment and run the main example (`example`) or every test (`test`).
# torch: an installed torch is used as it is; torch==2.13.0 is installed only when none is found.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-example}"
venv="${PYFUSER_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$venv"
fi
py="$venv/bin/python"
if ! "$py" -c "import torch" 2>/dev/null; then
  "$py" -m pip install -q torch==2.13.0
fi
case "$what" in
  example)
    "$py" -m pip install -q --no-build-isolation -e . 2>/dev/null || "$py" -m pip install -q -e .
    exec "$py" examples/main.py "${@:2}"
    ;;
  test)
    "$py" -m pip install -q --no-build-isolation -e ".[test,triton]" 2>/dev/null || "$py" -m pip install -q -e ".[test,triton]"
    "$py" -m ruff check pyfuser tests examples benchmarks scripts
    "$venv/bin/lint-imports" --no-cache --no-logo
    "$py" -m mypy  # files and strictness: [tool.mypy] in pyproject.toml
    # Two workers: the Triton interpreter runs kernels on one core each (CI has two); -n 0 runs serially.
    exec "$py" -m pytest -q -n 2 "${@:2}"
    ;;
  *)
    echo "usage: scripts/dev.sh example|test [args...]" >&2
    exit 2
    ;;
esac
