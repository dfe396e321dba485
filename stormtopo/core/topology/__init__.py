"""The switch tree (tree), how users describe it (fabric file, node labels) and Volcano's HyperNodes."""
