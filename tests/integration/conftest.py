"""Fixtures more than one integration module asks for by name."""

from tests.integration.healing_cluster import grown  # noqa: F401 (the seed's tree with six more leaves)
