#!/bin/bash
# On the CUDA machine, after benchmarks/gpu_prepare.sh: bash .gpu/gpu_run.sh
#   OUT=dir (default /tmp/gout: gpu.json lands there), W=scratch dir, ARGS="..." more arguments for benchmarks/gpu.py
#   LOCAL=1 VENV=.venv: no install, this venv's python (a smoke run on any machine: ARGS="--device cpu --quick ...")
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
G=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gout}; W=${W:-/tmp/gw}; mkdir -p "$OUT"; rm -rf "$W"; mkdir -p "$W"
cp -r $G/src $W/src
if [ "${LOCAL:-0}" = 1 ]; then
  PY=$VENV/bin/python; export SIEVE_BIN=$VENV/bin/sieve
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $G/whl/*.whl || exit 11
  PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    --target /tmp/site2 $W/src > $W/pip-sieve.txt 2>&1 || { tail -20 $W/pip-sieve.txt; exit 12; }
  export PYTHONPATH=/tmp/site2:/tmp/site SIEVE_BIN=/tmp/site2/bin/sieve PATH=/tmp/site/bin:$PATH  # py-spy for --spy
  PY=python3
fi
$PY -c "import sieve.service.app, bm25s, uvicorn, httpx, torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 13
M=$W/models; cp -r $G/models $M
$PY $W/src/benchmarks/gpu_models.py rebuild $M/be/stats.json $M/be/model.safetensors 1 || exit 14
$PY $W/src/benchmarks/gpu_models.py rebuild $M/ce/stats.json $M/ce/model.safetensors 2 || exit 14
$PY $W/src/benchmarks/gpu_models.py rebuild $M/cmc/stats.json $M/cmc/cmc.safetensors 3 || exit 14
(cd $W/src && $PY benchmarks/gpu_models.py pin-base $M/be $M/cmc-fusion $M/cmc) || exit 15
cd $W/src && $PY benchmarks/gpu.py --models $M --corpus $G/data/corpus.jsonl --queries $G/data/queries.jsonl \
  --work $W/run --out $OUT/gpu.json ${ARGS:-}
