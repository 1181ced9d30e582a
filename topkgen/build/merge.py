"""`topkgen merge`: the bundles of `build --shard`, or per-arch bundles of `build --arch`,
joined into the one bundle a single build (of the same archs) would have written, refused
unless every part comes from the same policy and toolchain (and shards from the same plan)."""

from __future__ import annotations

from pathlib import Path

from topkgen.build import bundle
from topkgen.manifest import reading as manifests
from topkgen.policy import DispatchError, in_policy_order, plan, rule_record
from topkgen.build.shards import ShardError, plan_sha256, share


# Fields every part must agree on: what the full bundle's manifest takes from them.
SHARED_FIELDS = ("generator", "toolchain", "policy", "archs", "jit_only", "nvrtc_version")
# Fields per-arch bundles must agree on (each has its own archs, and the JIT tiers of those).
BUILD_FIELDS = ("generator", "toolchain", "policy", "nvrtc_version")


def merge(parts: list[Path], out: Path, *, force: bool = False) -> dict:
    """Validate the parts and write the full bundle to `out`; returns its manifest. `force`
    lets it replace a directory that is not a bundle, as for build; never one of the parts.

    Kept whole: its checks run in the order a reader of a refusal needs (the parts, then what
    they share, then every kernel exactly once), each naming the part it found wrong."""
    from topkgen.common.destinations import check_bundle_destination

    # Before any work: never replace a directory of the user's, nor a part being read.
    check_bundle_destination(out, force=force, inputs=parts)
    loaded = []
    for part in parts:
        try:
            manifest, root = manifests.load_manifest(part)
        except manifests.ManifestError as err:
            raise ShardError(str(err)) from None
        loaded.append((part, manifest, root))
    sharded = ["shard" in manifest for _, manifest, _ in loaded]
    if not any(sharded):
        return _merge_archs(loaded, out, force=force)
    if not all(sharded):
        whole = next(part for (part, _, _), is_part in zip(loaded, sharded) if not is_part)
        raise ShardError(f"{whole}: a whole bundle among shards (merge shards of one plan, or bundles of other archs, "
                         f"not both)")
    first_part, first, _ = loaded[0]
    for part, manifest, _ in loaded[1:]:
        _same_build(part, manifest, first_part, first, SHARED_FIELDS, "the parts")
        for field in ("count", "plan_sha256"):
            if manifest["shard"][field] != first["shard"][field]:
                raise ShardError(f"{part}: shard.{field} differs from {first_part} (the parts come from different plans)")

    count = first["shard"]["count"]
    by_index: dict[int, Path] = {}
    for part, manifest, _ in loaded:
        index = manifest["shard"]["index"]
        if index > count:
            raise ShardError(f"{part}: shard.index {index} is larger than shard.count {count}")
        if index in by_index:
            raise ShardError(f"shard {index}/{count} given twice: {by_index[index]} and {part}")
        by_index[index] = part
    missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in by_index]
    if missing:
        raise ShardError(f"shard{'s' if len(missing) > 1 else ''} {_first_few(missing)} missing "
                         f"(given: {_first_few([f'{i}/{count}' for i in sorted(by_index)])})")

    policy = manifests.manifest_policy(first, str(first_part / manifests.MANIFEST))
    archs = first["archs"]
    unknown = [a for a in archs if a not in policy.archs]
    if unknown:
        raise ShardError(f"{first_part}: archs {', '.join(unknown)} are not in the policy the parts embed")
    specs = [spec for arch in archs for spec in plan(policy, arch)]
    if plan_sha256(specs, archs) != first["shard"]["plan_sha256"]:
        raise ShardError(f"{first_part}: shard.plan_sha256 is not the plan this topkgen makes of the parts' policy "
                         f"(built by another topkgen version?)")
    if [rule_record(r) for r in policy.jit_only_rules(archs)] != first["jit_only"]:
        raise ShardError(f"{first_part}: jit_only does not match the parts' policy")

    entries: dict[str, dict] = {}
    cubins: dict[str, bytes] = {}
    for part, manifest, root in loaded:
        expected = share(specs, manifest["shard"]["index"], count)
        _take_kernels(part, manifest, root, expected, f"shard {manifest['shard']['index']}/{count} of the plan",
                      entries, cubins)

    manifest, jit_files = bundle.manifest_document(policy, first["policy"], archs, [entries[s.name] for s in specs],
                                                   first["toolchain"])
    bundle.write_bundle(out, manifest, cubins | jit_files, force=force, inputs=tuple(parts))
    return manifest


def _same_build(part: Path, manifest: dict, first_part: Path, first: dict, fields: tuple[str, ...], what: str) -> None:
    """`part` has the first part's `fields`, or the first that differs is named."""
    for field in fields:
        if manifest[field] != first[field]:
            raise ShardError(f"{part}: {_first_difference(field, first[field], manifest[field])} differs from "
                             f"{first_part} ({what} come from different builds)")


def _merge_archs(loaded: list[tuple[Path, dict, Path]], out: Path, *, force: bool) -> dict:
    """Bundles of disjoint archs (`build --arch`) of one policy and toolchain, joined into the
    bundle `build --arch` of all of them writes: the archs in the policy's order, each one's
    kernels checked against the plan, the dispatch and JIT sources made as a build makes them."""
    first_part, first, _ = loaded[0]
    for part, manifest, _ in loaded[1:]:
        _same_build(part, manifest, first_part, first, BUILD_FIELDS, "the bundles")
    owner: dict[str, Path] = {}
    for part, manifest, _ in loaded:
        for arch in manifest["archs"]:
            if arch in owner:
                raise ShardError(f"arch {arch} is in two bundles: {owner[arch]} and {part} (merge bundles of other archs)")
            owner[arch] = part
    policy = manifests.manifest_policy(first, str(first_part / manifests.MANIFEST))
    try:
        archs = in_policy_order(policy, owner)
    except DispatchError as err:
        raise ShardError(f"{first_part}: {err.args[0]}") from None
    entries: dict[str, dict] = {}
    cubins: dict[str, bytes] = {}
    for part, manifest, root in loaded:
        own = in_policy_order(policy, manifest["archs"])
        if [rule_record(r) for r in policy.jit_only_rules(own)] != manifest["jit_only"]:
            raise ShardError(f"{part}: jit_only does not match the bundles' policy")
        expected = [spec for arch in own for spec in plan(policy, arch)]
        _take_kernels(part, manifest, root, expected, f"the plan of {', '.join(own)}", entries, cubins)
    specs = [spec for arch in archs for spec in plan(policy, arch)]
    manifest, jit_files = bundle.manifest_document(policy, first["policy"], archs, [entries[s.name] for s in specs],
                                                   first["toolchain"])
    bundle.write_bundle(out, manifest, cubins | jit_files, force=force, inputs=tuple(part for part, _, _ in loaded))
    return manifest


def _take_kernels(part: Path, manifest: dict, root: Path, expected: list, what: str, entries: dict[str, dict],
                  cubins: dict[str, bytes]) -> None:
    """A part's kernel entries and cubins into `entries` and `cubins`, after checking that they
    are `expected` (the kernels `what` names) as this topkgen renders them, and every file as a
    loader checks it (sha256, ELF machine and SM)."""
    from topkgen.build.compile import cache_key
    from topkgen.build.render import render

    try:
        files = manifests.read_files(root, manifest)
    except manifests.ManifestError as err:
        raise ShardError(f"{part}: {err}") from None
    names = [k["name"] for k in manifest["kernels"]]
    if names != [s.name for s in expected]:
        extra = sorted(set(names) - {s.name for s in expected})
        absent = [s.name for s in expected if s.name not in names]
        raise ShardError(f"{part}: kernels are not {what}"
                         + (f"; not in this share: {', '.join(extra)}" if extra else "")
                         + (f"; missing: {', '.join(absent)}" if absent else "")
                         + ("; listed twice or out of order" if not extra and not absent else ""))
    for spec, entry in zip(expected, manifest["kernels"]):
        source = render(spec)
        planned = bundle.planned_entry(spec, source, cache_key(source, spec.name, spec.nvrtc_target, manifest["toolchain"]))
        wrong = [field for field, value in planned.items() if entry[field] != value]
        if wrong:
            raise ShardError(f"{part}: kernel {spec.name}: {', '.join(wrong)} not what the plan and "
                             f"this topkgen's templates give")
        cubin = files[spec.name]
        if len(cubin) != entry["size_bytes"]:
            raise ShardError(f"{part}: kernel {spec.name}: the cubin's size does not match the manifest")
        entries[spec.name] = entry
        cubins[entry["cubin"]] = cubin
        if "ptx" in entry:  # checked by read_files
            cubins[entry["ptx"]["path"]] = files[f"{spec.name}.ptx"]


def _first_few(items: list[str], shown: int = 5) -> str:
    """A list for a one-line message: a manifest's shard count can be anything up to 999999."""
    more = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {more} more" if more > 1 else f", {items[-1]}" if more == 1 else "")


def _first_difference(field: str, a: object, b: object) -> str:
    """The most specific key where two manifest values differ (policy.sha256, not policy)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _first_difference(f"{field}.{key}", a.get(key), b.get(key))
    return field
