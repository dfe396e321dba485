"""Versions: AIBrix's and Volcano's releases, read from their controllers' images, against COMPATIBILITY.md's
tested pairs, and what the installed PodGroup CRD offers."""

from __future__ import annotations

import re
from collections.abc import Iterable

from stormtopo.core.capabilities import MIN_VOLCANO, TESTED_AIBRIX, TESTED_VOLCANO, TIER_NAMES_VOLCANO, cluster_tiers
from stormtopo.core.diagnosis.findings import Finding, Level
from stormtopo.core.diagnosis.snapshot import AIBRIX_NAMESPACE, Snapshot
from stormtopo.core.volcano_conf import VOLCANO_NAMESPACE

_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+][0-9A-Za-z.-]+)?")


def image_tag(image: str) -> tuple[str, str | None]:
    """An image's repository (without registry port confusion) and tag; tag None when pinned by digest alone."""
    reference = image.split("@", 1)[0]
    repository, _, tag = reference.rpartition(":")
    if not repository or "/" in tag:  # no tag: the colon was a registry's port
        return reference, None
    return repository, tag


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    match = _VERSION.fullmatch(text or "")
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def _component_images(images: Iterable[tuple[str, str]]) -> dict[str, list[tuple[str, str | None]]]:
    """Volcano's and AIBrix's controller images, as (deployment, tag)."""
    out: dict[str, list[tuple[str, str | None]]] = {"Volcano": [], "AIBrix": []}
    for deployment, image in images:
        repository, tag = image_tag(image)
        base = repository.rsplit("/", 1)[-1]
        if base in ("vc-scheduler", "vc-controller-manager"):
            out["Volcano"].append((deployment, tag))
        elif base == "controller-manager" and "aibrix" in repository:
            out["AIBrix"].append((deployment, tag))
    return out


def check_versions(snapshot: Snapshot) -> list[Finding]:
    """AIBrix's and Volcano's releases (from their controllers' images) against COMPATIBILITY.md's tested pairs
    (core/capabilities.py), and what the installed PodGroup CRD offers."""
    check = "versions"
    findings: list[Finding] = []
    found = _component_images(snapshot.images)
    schema_known = snapshot.podgroup_schema is not None
    offers = cluster_tiers((), snapshot.podgroup_schema)
    if schema_known and not offers.has_network_topology:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                "the PodGroup CRD has no spec.networkTopology (Volcano older than 1.12): no topology can be requested",
                "upgrade Volcano to 1.12 or newer (1.14 or newer for tier names and nested placement)",
            )
        )
    for component, tested, namespace in (("Volcano", TESTED_VOLCANO, VOLCANO_NAMESPACE), ("AIBrix", TESTED_AIBRIX, AIBRIX_NAMESPACE)):
        tags = sorted({tag or "no tag" for _, tag in found[component]})
        where = ", ".join(sorted({d for d, _ in found[component]}))
        matrix = f"{', '.join(tested)} (COMPATIBILITY.md)"
        if len(tags) > 1:
            findings.append(
                Finding(
                    Level.WARNING, check, f"{component}: controllers run different releases ({where}: {', '.join(tags)})", "run one release"
                )
            )
            continue
        version = parse_version(tags[0]) if tags else None
        if version is None:
            why = (
                f"unknown (the image of {where} carries no release tag)"
                if tags
                else f"unknown (no Deployment in {namespace} runs its controller image)"
            )
            if "deployments" in snapshot.unreadable:
                why = f"unknown (Deployments in {namespace} could not be read: {snapshot.unreadable['deployments']})"
            if component == "Volcano" and schema_known:
                why += "; its PodGroup CRD has " + (
                    "highestTierName and subGroupPolicy (1.14 or newer)"
                    if offers.has_tier_name_field
                    else "no highestTierName (1.12 or 1.13)"
                )
            findings.append(Finding(Level.WARNING, check, f"{component} {why}", f"check it by hand; tested: {matrix}"))
            continue
        release = tags[0] if tags[0].startswith("v") else f"v{tags[0]}"
        if component == "Volcano" and version[:2] < MIN_VOLCANO:
            findings.append(
                Finding(
                    Level.ERROR, check, f"Volcano {release} ({where}) has no PodGroup networkTopology", "upgrade Volcano to 1.12 or newer"
                )
            )
        elif release in tested:
            note = "; tier names and nested placement need 1.14" if component == "Volcano" and version[:2] < TIER_NAMES_VOLCANO else ""
            findings.append(Finding(Level.OK, check, f"{component} {release} ({where}): tested{note}"))
        else:
            findings.append(
                Finding(
                    Level.WARNING,
                    check,
                    f"{component} {release} ({where}) was not tested with stormtopo",
                    f"prefer a tested release: {matrix}",
                )
            )
    return findings
