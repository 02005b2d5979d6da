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


class TokenizerLocks:
    """Shallow copies of models (same weights) whose tokenizers are locked; the caller's objects are left as they
    are. Models that share a tokenizer share its lock, and a model used twice (a CMC query tower that is the
    bi-encoder, annCUR's cross-encoder that is the CE stage's) stays one object. A model is anything with a
    `tokenizer`, or a dataclass holding such models (a CMC bundle, annCUR); anything else is returned as it is."""

    def __init__(self):
        self.proxies: dict[int, LockedTokenizer] = {}
        self.copies: dict[int, object] = {}

    def locked(self, model):
        if model is None:
            return None
        if id(model) in self.copies:
            return self.copies[id(model)]
        if hasattr(model, "tokenizer"):
            tokenizer = model.tokenizer
            if not isinstance(tokenizer, LockedTokenizer):
                tokenizer = self.proxies.setdefault(id(tokenizer), LockedTokenizer(tokenizer))
            clone = copy.copy(model)
            clone.tokenizer = tokenizer
        elif dataclasses.is_dataclass(model) and not isinstance(model, type):
            parts = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}
            changed = {name: self.locked(value) for name, value in parts.items() if self.is_model(value)}
            clone = dataclasses.replace(model, **changed) if changed else model
        else:
            clone = model
        self.copies[id(model)] = clone
        self.copies.setdefault(id(clone), clone)  # locking a locked copy again (a model swapped in later) keeps it
        return clone

    @staticmethod
    def is_model(value) -> bool:
        return hasattr(value, "tokenizer") or (dataclasses.is_dataclass(value) and not isinstance(value, type)
                                               and any(hasattr(getattr(value, f.name), "tokenizer")
                                                       for f in dataclasses.fields(value)))

