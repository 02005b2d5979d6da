"""`sieve --help`, every `sieve <command> --help` and argument errors answer without importing torch, transformers,
faiss or the research stages (seconds of imports): those are imported by the commands that use them. Checked in a
fresh interpreter through sys.modules, not with a timer."""
from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "faiss", "openvino", "bm25s", "sieve.research.late", "sieve.research.heads",
         "sieve.training.cmc_train", "sieve.training.adapt", "sieve.evaluation.runner", "sieve.stages")

PROBE = """
import argparse, contextlib, io, json, sys
from sieve import cli

def commands(parser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))
    yield path

asked = [[*path, "--help"] for path in commands(cli.build_parser())]
asked += [["bogus-command"], ["index", "build"], ["serve", "--port", "not-a-number"], ["adapt", "--steps", "many"]]
codes = []
for argv in asked:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            cli.main(argv)
            codes.append(None)
        except SystemExit as exc:
            codes.append(exc.code)
print(json.dumps({"asked": asked, "codes": codes, "modules": sorted(sys.modules)}))
"""


def test_help_and_argument_errors_import_nothing_heavy():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True)
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(probe["asked"]) > 20, probe["asked"]  # every command and sub-command was asked for its help
    assert all(code == 0 for argv, code in zip(probe["asked"], probe["codes"]) if argv[-1] == "--help"), probe
    assert all(code == 2 for argv, code in zip(probe["asked"], probe["codes"]) if argv[-1] != "--help"), probe
    loaded = [m for m in probe["modules"] if m in HEAVY or m.startswith(tuple(f"{h}." for h in HEAVY))]
    assert not loaded, f"imported by --help or an argument error: {loaded[:20]}"
