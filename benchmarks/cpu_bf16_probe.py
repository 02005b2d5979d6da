"""The bi-encoder's forward in fp32 and bf16 on this machine's CPU, in one quiet process: the first call of each new
input shape, then the mean of 3 warm calls, at 4 intra-op threads (what one of 4 workers gets on 16 cores).

Written for the H200 machine's CPU, where the CPU mode's bf16 query tower took 2.5 s per /search under load
(benchmarks/results/gpu_nvidia_h200_s38.json): alone, bf16 is not slower there
(benchmarks/results/gpu_h200_host_cpu_bf16_probe_s38.json).

    python benchmarks/cpu_bf16_probe.py MODEL_DIR OUT.json     # MODEL_DIR: a Hugging Face checkpoint directory
"""
from __future__ import annotations

import json
import sys
import time

import torch
from transformers import AutoModel

SHAPES = [(1, 12), (3, 17), (8, 9), (16, 24), (5, 31), (2, 12)]  # (batch, tokens)


def probe(path: str, dtype: torch.dtype) -> list[dict]:
    model = AutoModel.from_pretrained(path, torch_dtype=dtype).eval()
    rows = []
    with torch.inference_mode():
        for b, s in SHAPES:
            ids, mask = torch.randint(1000, 2000, (b, s)), torch.ones(b, s, dtype=torch.long)
            start = time.perf_counter()
            model(input_ids=ids, attention_mask=mask)
            first = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(3):
                model(input_ids=ids, attention_mask=mask)
            rows.append({"b": b, "s": s, "first_ms": round(first * 1e3, 2),
                         "warm_ms": round((time.perf_counter() - start) / 3 * 1e3, 2)})
            print(dtype, rows[-1], flush=True)
    return rows


def main() -> None:
    path, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(4)
    result = {"torch": torch.__version__, "threads": 4}
    for dtype in (torch.float32, torch.bfloat16):
        result[str(dtype)] = probe(path, dtype)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
