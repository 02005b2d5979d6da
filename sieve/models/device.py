"""Device choice, made once at start-up by the caller (never inside model code)."""
from __future__ import annotations

import torch


def pick_device(preference: str = "auto") -> torch.device:
    """'auto' -> CUDA when present, else CPU; 'cpu' / 'cuda' / 'cuda:N' are taken as given."""
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(preference)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {preference!r} was asked for but CUDA is not available; use 'auto' or 'cpu'")
    return device
