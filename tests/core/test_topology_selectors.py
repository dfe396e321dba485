"""HyperNode members resolved as Volcano v1.15.1 resolves them: exactMatch, regexMatch (a search), labelMatch."""

from __future__ import annotations

import re
from typing import Any

import pytest

from stormtopo.core.topology.hypernodes import topology_from_hypernodes
from stormtopo.core.topology.selectors import label_requirements, selected_nodes

NODES = {
    "gpu-a-01": {"rack": "r1", "zone": "z1", "accel": "h100"},
    "gpu-a-02": {"rack": "r1", "zone": "z1"},
    "gpu-b-01": {"rack": "r2", "zone": "z1", "accel": "h100"},
    "cpu-b-01": {"rack": "r2", "zone": "z2"},
}


def hypernode(name: str, tier: int, *members: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"tier": tier, "members": [{"type": t, "selector": s} for t, s in members]}}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({"exactMatch": {"name": "gpu-a-01"}}, {"gpu-a-01"}),
        ({"exactMatch": {"name": "not-listed"}}, {"not-listed"}),  # Volcano takes the name as given
        ({"exactMatch": {"name": ""}}, set()),
        ({"regexMatch": {"pattern": "^gpu-a-"}}, {"gpu-a-01", "gpu-a-02"}),
        ({"regexMatch": {"pattern": "-b-"}}, {"gpu-b-01", "cpu-b-01"}),  # only in the middle: Go's MatchString searches
        ({"regexMatch": {"pattern": "01$"}}, {"gpu-a-01", "gpu-b-01", "cpu-b-01"}),
        ({"regexMatch": {"pattern": "gpu-(a"}}, set()),  # does not compile: nothing
        ({"labelMatch": {"matchLabels": {"rack": "r1"}}}, {"gpu-a-01", "gpu-a-02"}),
        ({"labelMatch": {"matchLabels": {"rack": "r2", "accel": "h100"}}}, {"gpu-b-01"}),  # requirements are ANDed
        ({"labelMatch": {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r2", "r9"]}]}}, {"gpu-b-01", "cpu-b-01"}),
        # NotIn also holds where the label is missing
        ({"labelMatch": {"matchExpressions": [{"key": "accel", "operator": "NotIn", "values": ["h100"]}]}}, {"gpu-a-02", "cpu-b-01"}),
        ({"labelMatch": {"matchExpressions": [{"key": "accel", "operator": "Exists"}]}}, {"gpu-a-01", "gpu-b-01"}),
        ({"labelMatch": {"matchExpressions": [{"key": "accel", "operator": "DoesNotExist"}]}}, {"gpu-a-02", "cpu-b-01"}),
        (
            {"labelMatch": {"matchLabels": {"zone": "z1"}, "matchExpressions": [{"key": "accel", "operator": "DoesNotExist"}]}},
            {"gpu-a-02"},
        ),
        ({"labelMatch": {}}, set()),  # empty: Volcano selects nothing rather than everything
        ({"labelMatch": {"matchExpressions": [{"key": "rack", "operator": "Gt", "values": ["1"]}]}}, set()),
        ({"labelMatch": {"matchExpressions": [{"key": "rack", "operator": "In", "values": []}]}}, set()),
        ({"labelMatch": {"matchExpressions": [{"key": "accel", "operator": "Exists", "values": ["h100"]}]}}, set()),
        ({"labelMatch": {"matchExpressions": [{"key": "bad key", "operator": "DoesNotExist"}]}}, set()),  # invalid key
    ],
)
def test_a_node_member_selects_what_volcano_selects(selector: dict[str, Any], expected: set[str]) -> None:
    assert selected_nodes(selector, NODES) == expected


def test_the_tree_resolves_every_selector_kind_and_links_hypernodes_by_exact_match() -> None:
    hypernodes = [
        hypernode("leaf-a", 1, ("Node", {"regexMatch": {"pattern": "-a-"}})),
        hypernode("leaf-b", 1, ("Node", {"labelMatch": {"matchLabels": {"rack": "r2"}}})),
        hypernode("spine", 2, ("HyperNode", {"exactMatch": {"name": "leaf-a"}}), ("HyperNode", {"exactMatch": {"name": "leaf-b"}})),
        # Volcano ignores HyperNode members chosen by regex or labels: this one has no children
        hypernode("lonely", 2, ("HyperNode", {"regexMatch": {"pattern": "leaf"}})),
    ]
    topology = topology_from_hypernodes(hypernodes, NODES)
    assert topology.switches["leaf-a"].nodes == ("gpu-a-01", "gpu-a-02")
    assert topology.switches["leaf-b"].nodes == ("cpu-b-01", "gpu-b-01")
    assert topology.switches["spine"].children == ("leaf-a", "leaf-b")
    assert topology.switches["leaf-a"].parent == "spine" and topology.switches["lonely"].children == ()
    assert topology.span(["gpu-a-02", "cpu-b-01"]).hypernode == "spine"


def test_names_alone_still_work_and_label_members_then_select_nothing() -> None:
    hypernodes = [
        hypernode("leaf-a", 1, ("Node", {"regexMatch": {"pattern": "-a-"}})),
        hypernode("leaf-b", 1, ("Node", {"labelMatch": {"matchLabels": {"rack": "r2"}}})),
    ]
    for names in (list(NODES), {n: 8 for n in NODES}):  # a list of names, or names mapped to free GPUs
        topology = topology_from_hypernodes(hypernodes, names)
        assert topology.switches["leaf-a"].nodes == ("gpu-a-01", "gpu-a-02")
        assert topology.switches["leaf-b"].nodes == ()


def test_a_labelmatch_read_through_the_nodes_by_label_selects_what_a_scan_of_every_node_does() -> None:
    """The tree's build resolves a labelMatch that requires one of some values from the nodes that have them
    (NodeLookup: 512 leaves over 16,384 nodes went from 4.8 s to about 50 ms); it must select exactly what
    checking every node selects, whatever else the selector requires."""
    import itertools
    import random

    from stormtopo.core.topology.selectors import NodeLookup

    rng = random.Random(7)
    nodes = {f"n{i}": {k: rng.choice(["a", "b", "c"]) for k in ("rack", "zone", "pool") if rng.random() < 0.7} for i in range(200)}
    lookup = NodeLookup(nodes)
    requirements: list[dict[str, Any]] = [
        {"matchLabels": {"rack": "a"}},
        {"matchLabels": {"rack": "a", "zone": "b"}},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "c"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}, {"key": "pool", "operator": "In", "values": ["b"]}]},
        {"matchExpressions": [{"key": "rack", "operator": "Exists"}, {"key": "pool", "operator": "DoesNotExist"}]},
        {"matchLabels": {"rack": "z"}},
    ]
    for one, two in itertools.product(requirements, repeat=2):
        selector = {"labelMatch": {"matchLabels": {**one.get("matchLabels", {}), **two.get("matchLabels", {})},
                                   "matchExpressions": one.get("matchExpressions", []) + two.get("matchExpressions", [])}}  # fmt: skip
        scanned = {n for n, labels in nodes.items() if all(r.matches(labels) for r in label_requirements(selector["labelMatch"]) or [])}
        assert selected_nodes(selector, nodes, lookup) == selected_nodes(selector, nodes) == scanned, selector
    assert selected_nodes({"labelMatch": {"matchLabels": {"rack": "a"}}}, nodes, lookup)  # (not vacuous)


@pytest.mark.parametrize(
    ("pattern", "prefix"),
    [("^gpu-a-", "gpu-a-"), ("^gpu-a-0[0-9]$", "gpu-a-0"), ("^gpu-ab*", "gpu-a"), ("^gpu-a+", "gpu-a"), ("^g{2}", ""),
     ("gpu-a-", ""), ("^a|^b", ""), ("^(?i)gpu", ""), ("^gpu\\.a", "gpu"), ("^", ""), ("^gpu?", "gp")],
)  # fmt: skip
def test_a_patterns_literal_prefix_is_what_every_name_it_matches_begins_with(pattern: str, prefix: str) -> None:
    from stormtopo.core.topology.selectors import literal_prefix

    assert literal_prefix(pattern) == prefix


def test_a_regexmatch_read_through_the_names_sorted_selects_what_a_search_of_every_name_does() -> None:
    from stormtopo.core.topology.selectors import NodeLookup

    nodes: dict[str, dict[str, str]] = {f"{kind}-{rack}-{i:02}": {} for kind in ("gpu", "cpu", "gpux") for rack in "ab" for i in range(12)}
    lookup = NodeLookup(nodes)
    for pattern in ("^gpu-a-", "^gpu", "^gpu-a-0[0-9]$", "^gpux?-b", "^gp*u", "-a-1", "^cpu-b-11$", "^zzz", "^gpu-(a|b)-00", "(?i)^GPU-A"):
        scanned = {n for n in nodes if re.search(pattern, n)}
        assert selected_nodes({"regexMatch": {"pattern": pattern}}, nodes, lookup) == scanned, pattern
    assert len(selected_nodes({"regexMatch": {"pattern": "^gpu-a-"}}, nodes, lookup)) == 12  # (not vacuous)


def test_a_tree_built_over_the_last_builds_memo_is_the_tree_built_afresh() -> None:
    """The operator rebuilds the tree at each HyperNode change over what the last build resolved (TreeMemo: 16,384
    nodes, one leaf changed, 26 -> 6 ms); whatever changed (a HyperNode's object, one gone, a tier-0 HyperNode come
    or gone, the node labels a labelMatch or a pattern reads), the tree must be the one a build from nothing gives."""
    from stormtopo.core.topology.hypernodes import TreeMemo

    labels = {f"n{i}": {"rack": f"r{i % 3}"} for i in range(12)}
    hns = {
        "exact": hypernode("exact", 1, *[("Node", {"exactMatch": {"name": f"n{i}"}}) for i in range(4)]),
        "by-label": hypernode("by-label", 1, ("Node", {"labelMatch": {"matchLabels": {"rack": "r1"}}})),
        "by-name": hypernode("by-name", 1, ("Node", {"regexMatch": {"pattern": "^n1"}})),
        "spine": hypernode("spine", 2, *[("HyperNode", {"exactMatch": {"name": n}}) for n in ("exact", "by-label", "by-name", "gone")]),
    }
    memo = TreeMemo()

    def same() -> None:
        assert topology_from_hypernodes(hns.values(), labels, memo) == topology_from_hypernodes(hns.values(), labels)

    same()
    hns["exact"] = hypernode("exact", 1, *[("Node", {"exactMatch": {"name": f"n{i}"}}) for i in range(2)])  # a new object
    same()
    hns["n5.node"] = hypernode("n5.node", 0, ("Node", {"exactMatch": {"name": "n5"}}))
    folding = ("HyperNode", {"exactMatch": {"name": "n5.node"}})
    hns["exact"] = hypernode("exact", 1, ("Node", {"exactMatch": {"name": "n0"}}), folding)
    same()
    assert "n5" in topology_from_hypernodes(hns.values(), labels, memo).nodes_under("exact")  # (not vacuous: folded)
    del hns["n5.node"]  # the leaf still names it: no longer folded, a child of its own
    same()
    labels = {**labels, "n1": {"rack": "r2"}, "n13": {"rack": "r1"}}  # other labels (a new mapping), a new node
    same()
    assert "n13" in topology_from_hypernodes(hns.values(), labels, memo).nodes_under("by-name")
    del hns["by-label"]
    same()
    assert set(memo.resolved) == set(hns)  # nothing gone is kept
    # Only a HyperNode that selects by label or pattern keeps the labels it was resolved over (older ones not kept alive).
    assert memo.resolved["spine"][1] is None and memo.resolved["exact"][1] is None and memo.resolved["by-name"][1] is labels
