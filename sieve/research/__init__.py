"""Research stages, outside the serving core: annCUR (retrieval with the cross-encoder via CUR), the MixEncoder
and the late-interaction cross-encoder, with their trainers and index builders. They register into the core's
stage registry (sieve/pipeline/registry.py) through the `sieve.plugins` entry point (pyproject.toml); the core
imports nothing from here. docs/research.md says what each one is and what it measured.

Importing this package registers nothing and imports nothing heavy (the `sieve` command imports its sub-commands'
modules from here and must answer `--help` at once); the plugin loader calls `register_plugin()` after import.
"""


def register_plugin() -> None:
    """Registers the research heads and stages (each module registers itself when imported)."""
    from sieve.research import heads, late  # noqa: F401
    from sieve.research.anncur import stage as anncur_stage  # noqa: F401
    from sieve.research.mix import stage as mix_stage  # noqa: F401
