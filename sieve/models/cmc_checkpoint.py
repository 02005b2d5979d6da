"""CMC checkpoints: a directory with config.json, cmc.safetensors (the attention layers) and the towers as
Hugging Face directories (query_tower/, and candidate_tower/ in `separate` mode). Safetensors only: nothing
is ever unpickled.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from sieve.models.cmc import CMC, CMCConfig
from sieve.models.device import DeviceRuntime
from sieve.models.text_encoder import TextEncoder

FORMAT = 1


@dataclass
class CMCBundle:
    """Everything a CMC stage needs: the pure module and the towers that feed it."""

    config: CMCConfig
    model: CMC
    query_tower: TextEncoder
    candidate_tower: TextEncoder | None  # None in shared mode: candidates are the bi-encoder's vectors
    name: str
    base_model_hash: str  # the bi-encoder whose document vectors (shared) / initial weights the towers came from
    path: Path | None = None  # the checkpoint directory it was loaded from (None: built in memory)
    weights_hash: str = ""  # sha256 of the checkpoint's cmc.safetensors: two checkpoints of one name differ by it
    runtime: DeviceRuntime = field(default_factory=DeviceRuntime)  # how its forwards run (models/device.py)


def untrained_cmc(biencoder: TextEncoder, mode: str = "shared", seed: int = 0,
                  share_query_tower: bool = False) -> CMCBundle:
    """Towers initialised from the bi-encoder and identity layers: ranks exactly as the bi-encoder does.

    share_query_tower: the query tower IS the bi-encoder (for serving, where an untrained tower equals it and the
    searcher then encodes the query once); training needs its own copy (False) to update it.
    """
    torch.manual_seed(seed)
    cfg = CMCConfig(mode=mode, dim=biencoder.dim)
    model = CMC(cfg).to(biencoder.device).eval()
    candidate = biencoder.copy("cmc-candidate") if mode == "separate" else None
    query = biencoder if share_query_tower else biencoder.copy("cmc-query")
    return CMCBundle(cfg, model, query, candidate, "cmc-untrained", biencoder.weights_hash)


def save_cmc(bundle: CMCBundle, out_dir: str | Path, *, dtype: torch.dtype = torch.float16, metadata: dict | None = None,
             towers_from_base: bool = False) -> Path:
    """towers_from_base: the towers were frozen copies of the bi-encoder, so only the layers are stored and
    loading takes the towers from the configured bi-encoder (a 7 MB checkpoint instead of 50 MB)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in bundle.model.state_dict().items()}
    save_file(state, str(out / "cmc.safetensors"))
    towers = {"query_tower": bundle.query_tower, "candidate_tower": bundle.candidate_tower}
    for folder, tower in towers.items():
        if tower is not None and not towers_from_base:
            half = {k: v.detach().to("cpu", dtype).contiguous() for k, v in tower.module.transformer.state_dict().items()}
            tower.module.transformer.save_pretrained(out / folder, state_dict=half, safe_serialization=True)
            tower.tokenizer.save_pretrained(out / folder)
    config = {"format": FORMAT, "name": bundle.name, "cmc": bundle.config.to_dict(),
              "base_model_hash": bundle.base_model_hash, "towers_from_base": towers_from_base, "metadata": metadata or {}}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def load_cmc(path: str | Path, biencoder: TextEncoder) -> CMCBundle:
    """Load onto the bi-encoder's device; refuses a shared-mode checkpoint trained against another bi-encoder."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a CMC checkpoint (no config.json)")
    config = json.loads((path / "config.json").read_text())
    if config.get("format") != FORMAT:
        raise ValueError(f"CMC checkpoint {path} has format {config.get('format')!r}; this Sieve reads format {FORMAT}")
    cfg = CMCConfig(**config["cmc"])
    from_base = config.get("towers_from_base", False)
    if (cfg.mode == "shared" or from_base) and config["base_model_hash"] != biencoder.weights_hash:
        raise ValueError(
            f"CMC checkpoint {path} (shared mode) was trained on bi-encoder weights sha256 "
            f"{config['base_model_hash'][:12]}…, but the configured bi-encoder is {biencoder.weights_hash[:12]}…; "
            "shared mode scores the bi-encoder's own document vectors (and frozen towers are the bi-encoder itself), "
            "so both must match")
    model = CMC(cfg)
    weights = path / "cmc.safetensors"
    state = {k: v.float() for k, v in load_file(str(weights)).items()}
    model.load_state_dict(state)
    model.to(biencoder.device).eval()

    def tower(folder: str) -> TextEncoder:
        if from_base:  # frozen copy of the bi-encoder: share it (the searcher then encodes the query once)
            return biencoder
        return TextEncoder.from_pretrained(path / folder, name=f"{config['name']}-{folder}",
                                           lengths=biencoder.lengths, device=biencoder.device,
                                           batch_size=biencoder.batch_size)

    candidate = tower("candidate_tower") if cfg.mode == "separate" else None
    return CMCBundle(cfg, model, tower("query_tower"), candidate, config["name"], config["base_model_hash"],
                     path=path, weights_hash=hashlib.sha256(weights.read_bytes()).hexdigest())
