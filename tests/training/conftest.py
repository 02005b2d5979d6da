from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Training tests use tiny tensors on 2 cores shared with other processes: a second intra-op thread only adds
    synchronisation (a small training step measured 3.5 s with 2 threads and 0.3 s with 1 under load)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
