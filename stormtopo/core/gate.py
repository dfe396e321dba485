"""The StormService gate: what it may list for one AdmissionReview, checked against the cluster, and why it
refuses a new opted-in StormService that reached it unlabelled (pure: the shell is operator/optin.py `Gate`).
Only services opted in by an update are listed by it; see core/optin.py for the lists and the label."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.optin import LABEL_POLICY, MOVABLE, _meta, _roles, labelled, listing, split_key
from stormtopo.core.request import is_opted_in, written_scope
from stormtopo.core.vocabulary import OPTED_IN_LABEL

# -- what the gate may list ----------------------------------------------------------------------
#
# The gate cannot tell a review the API server sent from one anybody on the cluster network made up,
# unless the API server authenticates itself with a client certificate (webhook.py). So what it lists
# is checked against the cluster first, and never more than the cluster can confirm soon after:
# - it never unlists (only the reconciler does, from the StormService it watches);
# - it never lists a CREATE: a new StormService is held by the opt-in label on its role templates, which a
#   patch of the reviewed object puts there (a made-up review gets that patch back, and nothing else);
# - an UPDATE lists only if the stored StormService is the review's oldObject (same uid and
#   resourceVersion): a made-up or replayed one names a version that is not, or no longer, stored;
# - a listing the cluster has not confirmed within CONFIRM_SECONDS (the StormService stored with a
#   request) is taken back, and at most UNCONFIRMED_LIMIT per namespace are unconfirmed at a time: replays cannot
#   grow the ConfigMap, nor etcd with its rewrites;
# - a listing is claimed for the stored StormService's uid: once the watch shows the name under another
#   uid, it is read again, and taken back unless stored as claimed.

CONFIRM_SECONDS = 10.0  # a real create or update is stored, and watched, in well under a second
UNCONFIRMED_LIMIT = 32  # listings awaiting confirmation, per namespace and operator replica
# ... and over every namespace: a replay needs a real StormService at its stored version (read rights), so a
# tenant fills only the namespaces it can read, and another's genuine opt-in is not told to retry.
# Kept small: the sweep takes listings back one read at a time, and each waiting review polls them.
UNCONFIRMED_TOTAL = 128
REFUTED_LIMIT = 1024  # versions remembered as falsely listed (an LRU: bounded memory)


def unlabelled_create(stormservice: Mapping[str, Any]) -> str | None:
    """Why the gate refuses a new StormService, if it does: it asks for a topology, has roles, and reached
    the gate (after every mutation) without OPTED_IN_LABEL on each role template, so nothing would hold its
    pods while stormtopo is down. A refusal has no side effect: a made-up review gets it back, and nothing
    else."""
    annotations = _meta(stormservice).get("annotations") or {}
    if not is_opted_in(annotations) or not _roles(stormservice) or labelled(stormservice):
        return None
    return (
        f"StormService {_meta(stormservice).get('name', '')!r} asks for a network topology, but its role templates did not "
        f"get the label {OPTED_IN_LABEL} that holds its pods while stormtopo is down: the API server did not run "
        f"stormtopo's MutatingAdmissionPolicy ({LABEL_POLICY}; it serves that API, but is its MutatingAdmissionPolicy "
        "feature gate on?) or its webhook opt-in.stormservices.stormtopo.io (just installed?); retry, or put "
        f'"{OPTED_IN_LABEL}: "true"" on every role template yourself (stormtopo doctor checks which runs)'
    )


def gate_listing(
    operation: str,
    obj: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None,
    stored: Mapping[str, Any] | None,
    refuted: str | None = None,
) -> tuple[str | None, str]:
    """What the gate may list for one review, and why: (scope, reason), scope None listing nothing.
    `stored` is the StormService as the cluster holds it (None: it does not exist); `refuted` a
    resourceVersion of it already found falsely listed (a review naming it again is a replay)."""
    if operation == "CREATE":
        return None, "a new StormService is held by the label on its role templates (the mutating webhook's), never listed"
    want = listing(obj)
    if want is None:
        return None, "no request annotation: the gate never unlists (the reconciler does)"
    if labelled(obj):
        return None, "its role templates carry the opt-in label: the admission policy holds its pods without a listing"
    if not _meta(obj).get("name"):
        return None, "the review names no StormService"
    if operation != "UPDATE":
        return None, f"operation {operation!r} never lists"
    if stored is None:
        return None, "no such StormService: the review was made up"
    version = _meta(stored).get("resourceVersion")
    if _meta(old).get("uid") != _meta(stored).get("uid") or _meta(old).get("resourceVersion") != version:
        return None, "the review's oldObject is not the stored StormService: stale, replayed or made up"
    if refuted is not None and refuted == version:
        return None, "this version was listed once and the update never came: a replay"
    # Never MOVABLE: whether its pods may be evicted is the reconciler's to say, from the stored StormService
    # and its namespace (movable), and nothing waits on it; a review cannot make them evictable.
    return want.removesuffix(MOVABLE), "an update of the stored StormService that asks for a network topology"


def _may_be_listed(stored: Mapping[str, Any]) -> str | None:
    """What a stored StormService may be listed as, as far as the gate can tell: listing() of it, or, where its
    role templates carry the opt-in label, its scope: whether it stays listed for a while (replicas of its old,
    unlabelled templates) is the reconciler's to say, from its RoleSets, which the gate does not read."""
    want = listing(stored)
    annotations = _meta(stored).get("annotations") or {}
    if want is None and is_opted_in(annotations) and labelled(stored):
        return written_scope(annotations).value
    return want


def confirmed(stored: Mapping[str, Any] | None, listed: str | None = None) -> bool:
    """The cluster confirms a listing once the StormService is stored with a request, and (`listed`:
    what the gate listed) one that lists the same (a made-up review must not keep `+heal` on the list of
    a service that asks for no healing); the reconciler then keeps its listing from the StormService."""
    want = _may_be_listed(stored) if stored is not None else None
    return want is not None and (listed is None or want.removesuffix(MOVABLE) == listed.removesuffix(MOVABLE))


def uid_of(obj: Mapping[str, Any] | None) -> str:
    return str(_meta(obj).get("uid") or "")


def still_at(stormservice: Mapping[str, Any] | None, version: str) -> bool:
    """The StormService is still at the version an UPDATE review named as its old one: the update it
    reviewed has not happened (after a moment: a made-up or replayed review, or one refused after)."""
    return bool(version) and stormservice is not None and _meta(stormservice).get("resourceVersion") == version


def contradicted(stormservice: Mapping[str, Any] | None, claimed: str) -> bool:
    """The StormService exists under another uid than the listing was claimed for (the stored one's, when
    its update was reviewed): deleted and made again since. A claim without a uid is contradicted by any
    StormService of the name."""
    return stormservice is not None and (not claimed or uid_of(stormservice) != claimed)


@dataclass
class Unconfirmed:
    """The gate's listings that the cluster has not confirmed yet, with when each was written (pure:
    the caller passes the clock) and the uid each was claimed for, and the versions found falsely listed."""

    limit: int = UNCONFIRMED_LIMIT  # per namespace
    total: int = UNCONFIRMED_TOTAL
    ttl: float = CONFIRM_SECONDS
    since: dict[str, float] = field(default_factory=dict)
    claims: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)  # an UPDATE listing: the version its review named as old
    refuted: OrderedDict[str, str] = field(default_factory=OrderedDict)
    per_namespace: Counter[str] = field(default_factory=Counter)  # of `since`

    def has_room(self, key: str) -> bool:
        if key in self.since:
            return True
        return len(self.since) < self.total and self.in_namespace(key) < self.limit

    def in_namespace(self, key: str) -> int:
        """Unconfirmed listings of `key`'s namespace."""
        return self.per_namespace[split_key(key)[0]]

    def add(self, key: str, now: float, uid: str = "", version: str = "") -> bool:
        """Reserve a slot for `key`, claimed for `uid` (and, an UPDATE, from `version`; the caller checked
        has_room); True if new. A key's clock is never restarted: reviews repeated within ttl cannot keep
        an unconfirmed listing alive. Its claim is the last review's: a genuine one after a made-up one
        keeps the genuine uid."""
        self.claims[key] = uid
        self.versions[key] = version
        if key in self.since:
            return False
        self.since[key] = now
        self.per_namespace[split_key(key)[0]] += 1
        return True

    def drop(self, key: str) -> None:
        if self.since.pop(key, None) is not None:
            namespace = split_key(key)[0]
            self.per_namespace[namespace] -= 1
            if not self.per_namespace[namespace]:
                del self.per_namespace[namespace]
        self.claims.pop(key, None)
        self.versions.pop(key, None)

    def due(self, now: float) -> list[str]:
        """Keys unconfirmed for ttl or longer, oldest first: check each against the cluster."""
        return self.older_than(self.ttl, now)

    def older_than(self, age: float, now: float, limit: int | None = None) -> list[str]:
        """Keys unconfirmed for `age` or longer, oldest first (at most `limit`)."""
        return sorted((k for k, t in self.since.items() if now - t >= age), key=self.since.__getitem__)[:limit]

    def refute(self, key: str, version: str | None) -> None:
        """`key` was listed but its StormService, at `version`, asks for nothing: never again for it."""
        if version is None:
            return
        self.refuted[key] = version
        self.refuted.move_to_end(key)
        while len(self.refuted) > REFUTED_LIMIT:
            self.refuted.popitem(last=False)


def expiry_verdict(stored: Mapping[str, Any] | None, listed: str | None = None) -> str:
    """What becomes of a listing (`listed`) unconfirmed for ttl, given the StormService as stored now:
    'keep' (it exists with a request: the reconciler owns the listing), 'relist-refuted' (listed `+heal`
    but it asks for a topology without healing: a made-up or replayed update; list what it asks),
    'unlist-refuted' (it exists without a request: the same) or 'unlist' (it does not exist)."""
    if stored is None:
        return "unlist"
    want = _may_be_listed(stored)
    if want is None:
        return "unlist-refuted"
    # Only ever narrowed here (`+heal` taken off): this read may race the reconciler of another replica
    # writing what the service asks now, and a widening written from a stale read could outlive it.
    return "relist-refuted" if listed == want + MOVABLE else "keep"
