// Build wrapper for kwok (fake nodes and pods); kwok tracks a newer Kubernetes than the control plane.
module stormtopo.local/tools/kwok

go 1.26.0

require sigs.k8s.io/kwok v0.8.0
