"""The largest number of replicas that fit at once, each within one leaf: exact, as a small integer program.

Pods here ask for 1, 2, 4 or 8 GPUs, sizes of which each divides the next. For such sizes a set of pods
fits a leaf's nodes if and only if, for every size s, the pods of s GPUs or more ask for no more than the
leaf offers in whole multiples of s, Σ_nodes s·⌊free/s⌋: necessary, since on one node the pods of s or
more add up to a multiple of s; sufficient, since placing pods largest first keeps each node's room in
multiples of every smaller size (bin packing with divisible item sizes, Coffman, Garey and Johnson 1987).
A leaf is then a few knapsack constraints, and choosing which replicas go to which leaf is an integer
program of one variable per (replica shape, leaf), which HiGHS (scipy.optimize.milp) solves exactly in
milliseconds. It replaces a step-bounded search that, beyond its budget, could give only an upper bound.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

Leaves = Sequence[Sequence[int]]  # per leaf, its nodes' free GPUs


def size_classes(pods: Sequence[int]) -> tuple[int, ...]:
    """The distinct pod sizes, smallest first; ValueError unless each divides the next (the condition
    under which the per-size counts decide a leaf exactly)."""
    sizes = tuple(sorted(set(pods)))
    if sizes and sizes[0] <= 0:
        raise ValueError(f"pod sizes {sizes}: a pod asks for at least one GPU")
    for small, large in itertools.pairwise(sizes):
        if large % small:
            raise ValueError(f"pod sizes {sizes}: {large} is not a multiple of {small}; the exact test needs each to divide the next")
    return sizes


def room(leaf: Sequence[int], size: int) -> int:
    """GPUs a leaf offers to pods of `size` or more: each node's free GPUs in whole multiples of `size`."""
    return sum(size * (free // size) for free in leaf)


def demand(pods: Sequence[int], size: int) -> int:
    return sum(p for p in pods if p >= size)


def fits_leaf(leaf: Sequence[int], replicas: Sequence[Sequence[int]]) -> bool:
    """Do all these replicas' pods fit this leaf's nodes at once?"""
    pods = [p for r in replicas for p in r]
    return all(demand(pods, s) <= room(leaf, s) for s in size_classes(pods))


def most_within_leaves(leaves: Leaves, replicas: Sequence[Sequence[int]]) -> int:
    """The largest number of `replicas` that fit at once, each within one leaf (exact)."""
    shapes = Counter(tuple(sorted(r)) for r in replicas if r)
    # A shape no leaf can hold alone never counts; dropping it keeps the program small.
    kinds = [s for s in shapes if any(fits_leaf(leaf, [s]) for leaf in leaves)]
    if not kinds:
        return 0
    sizes = size_classes([p for s in kinds for p in s])
    n_leaves, n_kinds = len(leaves), len(kinds)
    variables = n_kinds * n_leaves  # x[k * n_leaves + l]: replicas of shape k within leaf l
    rows, upper = [], []
    for k in range(n_kinds):  # no more of a shape than exist
        row = np.zeros(variables)
        row[k * n_leaves : (k + 1) * n_leaves] = 1
        rows.append(row)
        upper.append(shapes[kinds[k]])
    for leaf_index, leaf in enumerate(leaves):  # each leaf, each size class: demand within room
        for size in sizes:
            row = np.zeros(variables)
            for k, shape in enumerate(kinds):
                row[k * n_leaves + leaf_index] = demand(shape, size)
            rows.append(row)
            upper.append(room(leaf, size))
    return most_integer(variables, rows, upper, "the leaf packing program")


def most_integer(variables: int, rows: Sequence[Any], upper: Sequence[float], what: str) -> int:
    """The largest sum of `variables` non-negative integers with rows . x <= upper (HiGHS, exact)."""
    result = milp(
        c=-np.ones(variables),
        constraints=LinearConstraint(np.array(rows), -np.inf, np.array(upper, dtype=float)),
        integrality=np.ones(variables),
        bounds=Bounds(0, np.inf),
    )
    if result.status != 0 or result.x is None:
        raise RuntimeError(f"{what} did not solve: {result.message}")
    return round(float(-result.fun))
