"""Input limits of the fabric file and of label discovery (issue 14, item 6): each refusal says what is
wrong and what is accepted, and nothing malicious is expanded or passed on to the API server."""

from __future__ import annotations

import time

import pytest

from stormtopo.core.topology.fabric import MAX_BYTES, parse_topology
from stormtopo.core.topology.labels import topology_from_labels
from stormtopo.core.topology.tree import TopologyError, is_name

# Under 350 bytes; a node's cpu that expands to 9^8 strings (hundreds of MB) once written out, as the node
# manifest would. The first anchor is on line 4.
BOMB = (
    "switches:\n  s0: [n0]\nnodeDefaults:\n  cpu: [&a [l,l,l,l,l,l,l,l,l],\n"
    + "".join(f"    &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}],\n" for i in range(7))
    + "  ]\n"
)


def test_an_alias_bomb_is_refused_at_once_naming_the_line() -> None:
    assert len(BOMB) < 350
    start = time.perf_counter()
    with pytest.raises(TopologyError) as caught:
        parse_topology(BOMB)
    assert time.perf_counter() - start < 2  # expanded, it would take minutes and gigabytes
    assert str(caught.value).startswith("line 4: YAML anchors and aliases are not accepted in a fabric file (found anchor &a)")


def test_an_alias_alone_is_refused_too() -> None:
    with pytest.raises(TopologyError, match=r"^line 3: YAML anchors and aliases .* \(found anchor &n\)"):
        parse_topology("switches:\n  s0: [n0]\n  s1: &n [n1]\n  s2: *n\n")


def test_a_fabric_file_over_4_mib_is_refused_with_the_limit() -> None:
    with pytest.raises(TopologyError) as caught:
        parse_topology("switches:\n  s0: [n0]\n" + "#" * MAX_BYTES)
    assert str(caught.value) == "the fabric file is 4,194,325 bytes; accepted: at most 4,194,304 bytes (4 MiB)"


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("s0", True),
        ("rack-1.dc-2", True),
        ("a" * 253, True),  # Kubernetes limits the whole name, not each part
        ("s0\n", False),  # `$` would accept this
        ("a..b", False),
        (".a", False),
        ("a.", False),
        ("a.-b", False),
        ("S0", False),
        ("a_b", False),
        ("", False),
        ("a" * 254, False),
    ],
)
def test_names_follow_the_dns_1123_subdomain_rule(name: str, valid: bool) -> None:
    assert is_name(name) is valid


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('switches:\n  "s0\\n": [n0]\n', "switch 's0\\n'"),
        ("switches:\n  a..b: [n0]\n", "switch 'a..b'"),
        ('switches:\n  s0: ["n0\\n"]\n', "node 'n0\\n'"),
        ("switches:\n  s0: [n0.]\n", "node 'n0.'"),
        (f"switches:\n  {'s' * 254}: [n0]\n", f"switch {'s' * 60!r}... (254 characters)"),
    ],
)
def test_a_bad_name_in_a_fabric_file_is_named_with_the_rule(text: str, shown: str) -> None:
    with pytest.raises(TopologyError) as caught:
        parse_topology(text)
    message = str(caught.value)
    assert message.startswith(f"line 2: {shown} is not a valid Kubernetes object name; accepted: at most 253 characters")
    assert "parts separated by single dots, each part starting and ending with a letter or digit" in message


def test_a_tier_name_longer_than_a_hypernode_accepts_is_refused() -> None:
    with pytest.raises(TopologyError, match=r"^line 4: tierNames\[1\] is 254 characters long; accepted: at most 253$"):
        parse_topology(f"switches:\n  s0: [n0]\ntierNames:\n  1: {'x' * 254}\n")


@pytest.mark.parametrize("value", ["a..b", "rack.", "-rack"])
def test_a_label_value_that_cannot_name_a_hypernode_is_refused(value: str) -> None:
    labels = {"n0": {"spine": "sp", "leaf": value}}
    with pytest.raises(TopologyError) as caught:
        topology_from_labels(labels, ["spine", "leaf"])
    assert str(caught.value).startswith(f"node n0: label leaf={value!r} cannot name a HyperNode; accepted: at most 253 characters")
