"""What serialising a /rerank (and /v2/rerank) answer costs the event loop: FastAPI's response_model path (the
returned model validated again into the declared field, dumped to Python, then json.dumps by JSONResponse) against
the schema's own serializer (service/responses.json_response, which /search already used). In process, CPU
microseconds per answer (the best of 5 repeats of `--n` answers), answers of 10 / 100 / 1,000 results, with and
without documents; checks that both give the same JSON value (float spelling may differ: 1e-05 against 0.00001).

    python benchmarks/rerank_serialise.py --out benchmarks/results/rerank_serialise_<host>.json
"""
from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fastapi.responses import JSONResponse  # noqa: E402
from fastapi.routing import serialize_response  # noqa: E402
from fastapi.utils import create_model_field  # noqa: E402

from sieve.evaluation.report import machine_info  # noqa: E402
from sieve.service import schemas  # noqa: E402
from sieve.service.responses import json_response  # noqa: E402


def answer(results: int, documents: bool) -> schemas.RerankResponse:
    rows = [schemas.RerankResult(index=i, relevance_score=0.37 - 1e-3 * i,
                                 document=schemas.DocumentOut(id=f"doc-{i}", text=f"Abstract {i}: " + "word " * 200)
                                 if documents else None) for i in range(results)]
    return schemas.RerankResponse(results=rows, timings_ms={"ce": 12.3, "total": 40.1}, model="ce", index_version=1,
                                  request_id="0" * 32)


def cpu_us(fn, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - started) / n * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    field = create_model_field(name="Response_rerank", type_=schemas.RerankResponse, mode="serialization")
    accepted = inspect.signature(serialize_response).parameters
    loop = asyncio.new_event_loop()
    rows = []
    print("| results | documents | FastAPI response_model, us | json_response, us | ratio | same JSON value |")
    print("|---:|---|---:|---:|---:|---|")
    for results in (10, 100, 1000):
        for documents in (False, True):
            reply = answer(results, documents)
            options = dict(field=field, response_content=reply, include=None, exclude=None, by_alias=True,
                           exclude_unset=False, exclude_defaults=False, exclude_none=False, is_coroutine=False)
            options = {k: v for k, v in options.items() if k in accepted}

            def via_fastapi() -> bytes:
                return JSONResponse(loop.run_until_complete(serialize_response(**options))).body

            same = json.loads(via_fastapi()) == json.loads(json_response(reply).body)
            n = max(10, args.n * 100 // max(results, 100))
            row = {"results": results, "documents": documents, "fastapi_us": round(cpu_us(via_fastapi, n), 1),
                   "json_response_us": round(cpu_us(lambda: json_response(reply), n), 1), "same_json": same}
            rows.append(row)
            print(f"| {results} | {documents} | {row['fastapi_us']} | {row['json_response_us']} | "
                  f"{row['json_response_us'] / row['fastapi_us']:.3f}x | {same} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine_info(), "rows": rows, "command": " ".join(sys.argv),
                                        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))


if __name__ == "__main__":
    main()
