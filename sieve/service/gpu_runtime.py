"""How the query towers and CMC run on the serving device (issue 32), from the settings, put in place at start-up and
on a CMC swap: bucketed shapes (SIEVE_SHAPE_BUCKETS), a CUDA stream per batcher thread (SIEVE_CUDA_STREAMS), CUDA
graphs (SIEVE_CUDA_GRAPHS). On a CPU only bucketing can be switched on (SIEVE_SHAPE_BUCKETS=on; the tests do);
streams and graphs are CUDA-only and never touch a CPU server."""
from __future__ import annotations

import logging
from dataclasses import astuple

from sieve.models.device import DeviceRuntime, graphed
from sieve.service.config import Settings

log = logging.getLogger("sieve")


def device_runtime(settings: Settings, device) -> DeviceRuntime:
    cuda = device.type == "cuda"
    graphs = cuda and settings.cuda_graphs
    if graphs and not settings.batching:  # graphs are recorded per thread: only a batcher thread calls a model
        log.warning("SIEVE_CUDA_GRAPHS needs SIEVE_BATCHING=true; running without CUDA graphs")
        graphs = False
    buckets = settings.shape_buckets == "on" or (settings.shape_buckets == "auto" and cuda) or graphs
    runtime = DeviceRuntime(buckets=buckets, streams=cuda and settings.cuda_streams, graphs=graphs)
    log.info("forwards on %s: shape buckets %s, CUDA streams %s, CUDA graphs %s", device, *astuple(runtime))
    return runtime


def apply_runtime(runtime: DeviceRuntime, device, biencoder, cmc=None) -> None:
    """Set `runtime` on the bi-encoder's query side and on a CMC (its own query tower too); after lowering precision,
    so a graphed module is the one served."""
    towers = [biencoder]
    if cmc is not None:
        cmc.runtime = runtime
        cmc.model = graphed(cmc.model, device, runtime.graphs)
        if cmc.query_tower is not biencoder:
            towers.append(cmc.query_tower)
    for tower in towers:
        if tower.runtime != runtime:  # a tower shared with an earlier CMC is graphed once
            tower.runtime = runtime
            tower.query_module = graphed(tower.query_module, device, runtime.graphs)
