"""Shards of one plan, built by separate CI jobs; merge.py assembles them.

A build matrix splits NVRTC's work; the merge is where the parts are proven to belong
together: the same policy, generator, toolchain and plan, every kernel exactly once, every
cubin verified. Anything else is refused, because a bundle assembled from mismatched jobs
would load and then serve the wrong kernels. The merged bundle is written by the same code
as a full build, so the two are byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import re

from topkgen.common.errors import InputError
from topkgen.policy import KernelSpec

_SHARD = re.compile(r"([0-9]{1,6})/([0-9]{1,6})")


class ShardError(InputError, ValueError):
    """A shard argument or a set of parts that cannot be merged: exit status 2."""


def parse(text: str, kernels: int) -> tuple[int, int]:
    """`I/N` with 1 <= I <= N (1-based, as CI matrices count jobs) and N at most the plan's
    `kernels`: a part with no kernel is a matrix job that does nothing, and a count past the
    plan's size is a typo, not a plan."""
    m = _SHARD.fullmatch(text.strip())
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ShardError(f"--shard {text}: expected INDEX/COUNT with 1 <= INDEX <= COUNT, e.g. 2/3")
    if int(m.group(2)) > max(kernels, 1):  # 1/1 stays a build of the whole plan, even an empty one
        raise ShardError(f"--shard {text}: more shards than the plan's {kernels} kernel{'s' * (kernels != 1)} "
                         f"(a part would hold none); expected a COUNT of at most {max(kernels, 1)}")
    return int(m.group(1)), int(m.group(2))


def share(specs: list[KernelSpec], index: int, count: int) -> list[KernelSpec]:
    """Shard `index`'s kernels: every count-th of the plan, so the shares are balanced by
    arch and family and are the same in every job."""
    return specs[index - 1::count]


def plan_sha256(specs: list[KernelSpec], archs: list[str]) -> str:
    doc = {"archs": archs, "kernels": [spec.record() for spec in specs]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def shard_record(specs: list[KernelSpec], archs: list[str], index: int, count: int) -> dict:
    return {"index": index, "count": count, "plan_sha256": plan_sha256(specs, archs)}


def part_of(manifest: dict) -> str | None:
    """`shard I/N` for the manifest of a part of a sharded build, None for a bundle's. A part's
    dispatch rows name kernels that other parts hold, so it is no bundle to load or compare."""
    shard = manifest.get("shard")
    return None if shard is None else f"shard {shard['index']}/{shard['count']}"
