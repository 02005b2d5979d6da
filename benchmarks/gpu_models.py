"""Model weights for a CUDA machine that cannot download them (benchmarks/gpu_prepare.sh, gpu_run.sh).

  stats SRC.safetensors OUT.json        per-tensor shape, dtype, mean and spread (here, from the real checkpoints)
  rebuild STATS.json OUT.safetensors SEED   random tensors of those shapes and spreads (there): the same
                                        architectures, FLOPs and loaders, meaningless rankings
  pin-base BE_DIR CMC_DIR...            write the rebuilt bi-encoder's weights hash into each CMC's config, so the
                                        server takes the CMC as fitting that bi-encoder
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
DTYPES = {v: k for k, v in NAMES.items()}


def stats(src: Path, out: Path) -> None:
    res = {}
    with safe_open(str(src), "pt") as f:
        for key in f.keys():
            t = f.get_tensor(key)
            row = {"shape": list(t.shape), "dtype": NAMES[t.dtype]}
            if t.is_floating_point():
                tf = t.float()
                row["mean"], row["std"] = tf.mean().item(), tf.std().item() if tf.numel() > 1 else 0.0
            else:
                row["max"] = int(t.max())
            res[key] = row
    out.write_text(json.dumps(res))


def rebuild(stats_file: Path, out: Path, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for key, s in json.loads(stats_file.read_text()).items():
        dtype = DTYPES[s["dtype"]]
        if dtype == torch.int64:  # position ids and the like: 0, 1, 2, ... up to the largest seen
            n = int(torch.tensor(s["shape"]).prod())
            tensors[key] = (torch.arange(n) % max(1, s.get("max", 1) + 1)).reshape(s["shape"])
        else:
            tensors[key] = (torch.randn(s["shape"], generator=g) * s["std"] + s["mean"]).to(dtype).contiguous()
    save_file(tensors, str(out), metadata={"format": "pt"})


def pin_base(be_dir: Path, *cmc_dirs: Path) -> None:
    from sieve.models.weights import weights_hash

    digest = weights_hash(be_dir)
    for d in cmc_dirs:
        config = json.loads((d / "config.json").read_text())
        config["base_model_hash"] = digest
        (d / "config.json").write_text(json.dumps(config))


if __name__ == "__main__":
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "stats":
        stats(Path(rest[0]), Path(rest[1]))
    elif command == "rebuild":
        rebuild(Path(rest[0]), Path(rest[1]), int(rest[2]))
    elif command == "pin-base":
        pin_base(*(Path(p) for p in rest))
    else:
        raise SystemExit(__doc__)
