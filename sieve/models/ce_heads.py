"""The heads the serving core knows: "cls" (sieve/models/ce_base.py) and the shipped "gated"
(sieve/models/ce_gated.py); the rest come from plugins (sieve.research.heads). Loading and building any head by
name goes through here; see ce_base.py for the checkpoint layout."""
from __future__ import annotations

from sieve.models import ce_gated  # noqa: F401 (registers "gated")
from sieve.models.ce_base import (HEAD_FILE, HEAD_WEIGHTS, HEADS, Head, PairLengths, PairScorer,  # noqa: F401
                                  SumOfParts, check_head_name, head_hash, load_classifier, load_head, new_head,
                                  read_head, record_lengths, register_head, trained_lengths)
