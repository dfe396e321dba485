"""The operator's leader Lease: held and renewed within its duration, or nobody reconciles."""

from __future__ import annotations

import datetime

from stormtopo.core.diagnosis.findings import Finding, Level
from stormtopo.core.diagnosis.snapshot import Snapshot

LEASE_GRACE = 30.0  # seconds beyond a Lease's duration before it counts as stale: clocks of two machines differ


def _timestamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def check_leader(snapshot: Snapshot) -> list[Finding]:
    """The operator's Lease: held and renewed within its duration, or nobody reconciles."""
    check, name = "leader", snapshot.lease_name
    if "leases" in snapshot.unreadable:
        return [
            Finding(
                Level.WARNING,
                check,
                f"Lease {name} could not be read ({snapshot.unreadable['leases']})",
                "use a kubeconfig that may list leases",
            )
        ]
    if not snapshot.leases:
        return [
            Finding(
                Level.WARNING,
                check,
                f"no Lease {name}: the operator runs without --leader-elect (one replica, as `stormtopo dev up` runs it) or not at all",
                "check that an operator pod runs (the chart runs two, with leader election)",
            )
        ]
    findings: list[Finding] = []
    for lease in snapshot.leases:
        meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        where = f"Lease {meta.get('namespace')}/{meta.get('name')}"
        holder = str(spec.get("holderIdentity") or "")
        renewed = _timestamp(spec.get("renewTime") or spec.get("acquireTime"))
        duration = float(spec.get("leaseDurationSeconds") or 15)
        age = None if renewed is None else snapshot.now - renewed
        todo = f"check the operator's pods in {meta.get('namespace')} and their logs; a Lease left by an uninstalled release can be deleted"
        if not holder:
            # A leader that stops releases the Lease: a clean shutdown, or an operator now run without --leader-elect.
            when = "" if age is None else f" {max(age, 0.0):.0f} s ago"
            findings.append(
                Finding(
                    Level.WARNING,
                    check,
                    f"{where}: released{when} and not taken over: no replica with leader election runs (an operator "
                    "without --leader-elect does not use it)",
                    todo,
                )
            )
        elif age is None or age > duration + LEASE_GRACE:
            last = "never renewed" if age is None else f"last renewed {age:.0f} s ago"
            findings.append(
                Finding(
                    Level.ERROR,
                    check,
                    f"{where}: {last} by {holder}, duration {duration:.0f} s: no replica leads, so PodGroups are not "
                    "reconciled (admission goes on)",
                    todo,
                )
            )
        else:
            findings.append(Finding(Level.OK, check, f"{where}: held by {holder}, renewed {max(age, 0.0):.0f} s ago"))
    return findings
