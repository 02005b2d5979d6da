"""The names the training commands offer as choices, in a module that imports nothing: `sieve --help` and
`sieve train ... --help` build their options from here and answer at once, without torch (each trainer checks its
config against the same names)."""
from __future__ import annotations

REGIMES = ("layers", "shared", "separate")  # sieve train cmc: what CMC training updates (training/cmc_train.py)
OBJECTIVES = ("gold", "listwise")  # sieve train cmc: one list per relevant document, or one per query
GENERATORS = ("title", "sentence", "span", "terms", "mix", "ict", "block")  # sieve adapt's pseudo-queries
STARTS = ("fusion", "first-stage")  # sieve adapt: the shipped fusion CMC's weights, or the identity (ranks as hybrid)
