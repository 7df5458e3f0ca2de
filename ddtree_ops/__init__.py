"""Operations tooling for DDTree on SGLang: the patch tool, the release-compatibility job.

One CLI, `ddtree-ops` (ddtree_ops.cli); each subcommand is a thin shell over a function
here that the tests call directly.
"""

__version__ = "0.1.0"
