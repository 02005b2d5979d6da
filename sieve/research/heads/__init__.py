"""Research cross-encoder heads, registered into sieve/models/ce_base.py's HEADS when imported: emb ([QEMB]/[DEMB]
markers), cls+late (late interaction), cls+cos (pooled cosine) and gated+late. The core serves cls and gated."""
from sieve.research.heads import cos, emb, gated_late, late_interaction  # noqa: F401 (each registers its head)
