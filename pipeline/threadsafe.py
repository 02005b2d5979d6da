"""Hugging Face fast tokenizers are not safe to call from two threads at once ("Already borrowed"): the batch
workers and the request threads share them, so every call goes through one lock per tokenizer. Tokenising is
short next to a forward pass, so the lock costs little."""
from __future__ import annotations

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


def lock_tokenizers(*models) -> None:
    """Give every model that has a tokenizer a locked one; models sharing a tokenizer share its lock."""
    proxies: dict[int, LockedTokenizer] = {}
    for model in models:
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None or isinstance(tokenizer, LockedTokenizer):
            continue
        model.tokenizer = proxies.setdefault(id(tokenizer), LockedTokenizer(tokenizer))
