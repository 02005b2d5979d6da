"""What the stage modules share: a model's identity for the cache fingerprint."""
from __future__ import annotations

def model_identity(model) -> list | None:
    """Name, weights and token lengths of a model that can answer a request; None where it is not loaded."""
    if model is None:
        return None
    lengths = getattr(model, "lengths", None)
    return [getattr(model, "name", None), getattr(model, "weights_hash", None), repr(lengths) if lengths else None]

