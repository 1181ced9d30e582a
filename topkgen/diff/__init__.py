"""`topkgen diff`: compare two kernel sets for code review. sides.py loads each side (a policy
file, a bundle, a git revision or the working tree); compare.py compares counts, kernels, JIT-only
tiers and dispatch over a grid of shapes into a Report; report.py writes it as text, markdown or
JSON. This facade keeps the names `from topkgen import diff` gave."""

from __future__ import annotations

from topkgen.diff.sides import (
    DEFAULT_POLICY_IN_REPO, WORKTREE, DiffInputError, Side, load_side, is_range, revision_range,
    load_worktree_side, build_sides, kernels_to_build)
from topkgen.diff.compare import (
    DEFAULT_KS, DEFAULT_NS, DEFAULT_ROWS, UNSUPPORTED, MOVES, ASPECTS, IDENTITY, Shape, Report,
    default_shapes, MAX_SHAPES_BYTES, load_shapes, policy_serves, bundle_serves, serves, movement, compare,
    field_label, field_aspect)

__all__ = [
    'DEFAULT_POLICY_IN_REPO', 'WORKTREE', 'DiffInputError', 'Side', 'load_side', 'is_range',
    'revision_range', 'load_worktree_side', 'build_sides', 'kernels_to_build', 'DEFAULT_KS', 'DEFAULT_NS',
    'DEFAULT_ROWS', 'UNSUPPORTED', 'MOVES', 'ASPECTS', 'IDENTITY', 'Shape', 'Report', 'default_shapes',
    'MAX_SHAPES_BYTES', 'load_shapes', 'policy_serves', 'bundle_serves', 'serves', 'movement', 'compare',
    'field_label', 'field_aspect']
