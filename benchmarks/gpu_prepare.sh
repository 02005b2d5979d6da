#!/bin/bash
# The device machine receives the repository's working tree (tracked files, untracked ones git does not ignore, and
# the carried .gpu), which must stay under 64 MiB. The tracked files alone are ~72 MB
# (sieve/checkpoints/cross-encoder/model.safetensors 45 MB, sieve/checkpoints/cmc/cmc.safetensors 7 MB,
# benchmarks/results/ 15.6 MB) and .gpu with its wheels is ~59 MB. What worked (this script does not do it):
#   before the device call: bash benchmarks/gpu_tree.sh slim      (git rm --cached of those three paths, and
#                                                                   lists them in .git/info/exclude)
#   afterwards:             bash benchmarks/gpu_tree.sh restore   (git reset -q; the exclude lines removed)
# The last lines printed are the bytes that would travel now, with a warning over 64 MiB.
# Lays out .gpu/ at the repository root for benchmarks/gpu_run.sh on a CUDA machine whose python3 has torch but
# reaches no registry: wheels of Sieve's other dependencies (the versions in VENV), Sieve's source (this commit,
# without its large weight files) with benchmarks/gpu*.py, the models' configs and tokenizers with per-tensor
# statistics (gpu_models.py rebuilds the weights there at random with the same shapes and spread: same architectures
# and FLOPs, meaningless rankings), SciFact's corpus and queries. Adapted from ../shared/gpu-check/prepare.sh.
# usage, from the repository root: bash benchmarks/gpu_prepare.sh   (VENV=.venv, DATA=../shared/data/scifact;
# SKIP_WHEELS=1 leaves the wheels out, for a LOCAL=1 run of gpu_run.sh)
set -euo pipefail
ROOT=$(pwd); VENV=${VENV:-$ROOT/.venv}; DATA=${DATA:-$ROOT/../shared/data/scifact}
PY=$VENV/bin/python; G=$ROOT/.gpu
rm -rf "$G"; mkdir -p $G/whl $G/src $G/models/be $G/models/ce $G/models/cmc $G/models/cmc-fusion $G/data
EXCLUDE=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >> "$EXCLUDE"  # never committed
cp benchmarks/gpu_run.sh $G/
git archive HEAD sieve pyproject.toml README.md benchmarks/gpu.py benchmarks/gpu_micro.py benchmarks/gpu_models.py \
  benchmarks/zero_cost.py \
  | tar -x -C $G/src
git rev-parse HEAD > $G/src/COMMIT
find $G/src -name '*.safetensors' -size +1M -delete
CK=$ROOT/sieve/checkpoints
BE=$($PY -c "from sieve.models.weights import default_model_path; print(default_model_path())")
(cd $BE && cp -r 1_Pooling config.json config_sentence_transformers.json modules.json sentence_bert_config.json \
   special_tokens_map.json tokenizer.json tokenizer_config.json vocab.txt $G/models/be/)
(cd $CK/cross-encoder && cp config.json head.safetensors sieve_head.json special_tokens_map.json tokenizer.json \
   tokenizer_config.json vocab.txt $G/models/ce/)
cp $CK/cmc-fusion/config.json $CK/cmc-fusion/cmc.safetensors $G/models/cmc-fusion/
cp $CK/cmc/config.json $G/models/cmc/
$PY benchmarks/gpu_models.py stats $BE/model.safetensors $G/models/be/stats.json
$PY benchmarks/gpu_models.py stats $CK/cross-encoder/model.safetensors $G/models/ce/stats.json
$PY benchmarks/gpu_models.py stats $CK/cmc/cmc.safetensors $G/models/cmc/stats.json
cp $DATA/corpus.jsonl $DATA/queries.jsonl $G/data/
if [ "${SKIP_WHEELS:-0}" != 1 ]; then
  # what a CUDA image with torch lacks, at the versions this venv runs (the image has torch, numpy, jinja2, ...)
  pins=$($VENV/bin/pip freeze | python3 -c "
import sys, re
want = {'fastapi','starlette','pydantic','pydantic-core','pydantic-settings','python-dotenv','annotated-types',
        'typing-inspection','uvicorn','bm25s','pystemmer','swagger-ui-bundle','redis','transformers','tokenizers',
        'huggingface-hub','typing-extensions','annotated-doc','opentelemetry-api','faiss-cpu','httpx','httpcore',
        'h11','anyio','sniffio','prometheus-client','safetensors','tqdm','sentencex','py-spy',
        'httpx2','httpcore2','truststore','idna'}  # huggingface_hub 2.x imports httpx2
for line in sys.stdin:
    name = re.split('==', line.strip())[0]
    if re.sub('[-_.]+', '-', name).lower() in want: print(line.strip())")
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d $G/whl $pins
fi
du -sh $G
tree=$(bash "$ROOT/benchmarks/gpu_tree.sh" size)
gpu=$(du -sb $G | cut -f1); total=$((tree + gpu))
echo "working tree $tree bytes + .gpu $gpu bytes = $total bytes"
[ $total -le $((64 * 1024 * 1024)) ] || echo "WARNING: over 64 MiB: the device machine will not take it (see the top of this script)"
echo "send .gpu to the CUDA machine and run: bash .gpu/gpu_run.sh   (results in \$OUT, default /tmp/gout)"
