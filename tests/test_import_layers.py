"""The package's structure, enforced: import-linter's contracts in pyproject.toml (layers, the core never importing
the research stages, no import cycles inside any package), and one installed namespace (`sieve`) that works from
outside the checkout."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_are_kept():
    out = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
                          "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "3 kept, 0 broken" in out.stdout


def test_the_contracts_catch_a_core_module_importing_research(tmp_path):
    """The forbidden contract is live: a copy of the package where the searcher imports sieve.research fails it."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(REPO / "sieve", copy / "sieve", ignore=shutil.ignore_patterns("*.safetensors", "__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    searcher = copy / "sieve" / "pipeline" / "searcher.py"
    searcher.write_text(searcher.read_text() + "\nfrom sieve.research import late  # noqa\n")
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, '.'); "
                          "from importlinter.cli import lint_imports_command; lint_imports_command()", "--no-cache"],
                         cwd=copy, capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode != 0 and "imports nothing from the research stages BROKEN" in out.stdout


def test_the_wheel_claims_only_the_sieve_namespace_and_runs_from_outside_the_checkout(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "dist"), str(REPO)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = (tmp_path / "dist").glob("sieve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"sieve", next(t for t in top if t.endswith(".dist-info"))}, top
    assert "sieve/checkpoints/cmc-fusion/cmc.safetensors" in names and "sieve/demo_corpus.jsonl" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what a non-editable install puts into site-packages
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "models").mkdir()  # a user's own top-level package named like one of ours before: no clash now
    (outside / "models" / "__init__.py").write_text("MINE = True\n")
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    code = ("import sieve, sieve.cli, models; from sieve import checkpoints; from sieve.cli import DEMO_CORPUS; "
            f"assert sieve.__file__.startswith({str(site)!r}), sieve.__file__; assert models.MINE; "
            "assert checkpoints.shipped(checkpoints.CMC) and DEMO_CORPUS.is_file(); print('ok')")
    run = subprocess.run([sys.executable, "-c", code], cwd=outside, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
    help_ = subprocess.run([sys.executable, "-c", "from sieve.cli import main; main(['--help'])"], cwd=outside,
                           env=env, capture_output=True, text=True, timeout=300)
    assert help_.returncode == 0 and "sieve" in help_.stdout and "serve" in help_.stdout, help_.stderr[-2000:]
