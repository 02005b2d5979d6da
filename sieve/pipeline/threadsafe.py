"""Hugging Face fast tokenizers are not safe to call from two threads at once ("Already borrowed"): the batch
workers and the request threads share them, so every call goes through one lock per tokenizer. Tokenising is
short next to a forward pass, so the lock costs little."""
from __future__ import annotations

import copy
import dataclasses
import threading


class LockedTokenizer:
    def __init__(self, inner):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_lock", threading.Lock())

    def __call__(self, *args, **kwargs):
        with self._lock:
            return self._inner(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def locked(*args, **kwargs):
            with self._lock:
                return attr(*args, **kwargs)
        return locked

    def __setattr__(self, name: str, value) -> None:
        setattr(self._inner, name, value)


def with_locked_tokenizers(biencoder, cmc, cross_encoder):
    """Shallow copies of the models (same weights) whose tokenizers are locked; the caller's objects are left as
    they are. Models that share a tokenizer share its lock, and a tower used twice (a CMC query tower that is the
    bi-encoder) stays one object."""
    proxies: dict[int, LockedTokenizer] = {}
    copies: dict[int, object] = {}

    def locked(model):
        if model is None:
            return None
        if id(model) not in copies:
            tokenizer = model.tokenizer
            if not isinstance(tokenizer, LockedTokenizer):
                tokenizer = proxies.setdefault(id(tokenizer), LockedTokenizer(tokenizer))
            clone = copy.copy(model)
            clone.tokenizer = tokenizer
            copies[id(model)] = clone
        return copies[id(model)]

    biencoder = locked(biencoder)
    if cmc is not None:
        cmc = dataclasses.replace(cmc, query_tower=locked(cmc.query_tower), candidate_tower=locked(cmc.candidate_tower))
    return biencoder, cmc, locked(cross_encoder)
