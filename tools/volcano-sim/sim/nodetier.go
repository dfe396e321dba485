package sim

// The node tier's rule, the one stormtopo ships (stormtopo/core/topology/node_tier.py: shortlist and
// whole_node_run): which nodes get a tier-0 HyperNode of their own. The simulator's layouts node-bucket and
// node-partial-next use it for stormtopo's openings (Case.Opening "", "-pairs", "fewest", "fewest-pairs",
// "spare-runs-N"); tools/volcano-sim/cmd/nodetier runs it on JSON cases, and
// tests/core/test_node_tier_parity.py requires the same list as the Python rule on generated cases.
//
// This file imports the standard library only, so that the command builds in seconds (the simulator's test
// builds Volcano's scheduler).

import "sort"

// TierLeaf is a leaf HyperNode and its nodes, in the leaf's order.
type TierLeaf struct {
	Name  string   `json:"name"`
	Nodes []string `json:"nodes"`
}

// TierParams are the rule's parameters (stormtopo's shortlist arguments of the same names).
type TierParams struct {
	PerFree    int  `json:"per_free"`    // partly used nodes listed per amount of free GPUs
	NextEmpty  int  `json:"next_empty"`  // empty nodes listed (the next to open)
	SpareRuns  int  `json:"spare_runs"`  // a run is kept only while the other leaves' runs hold fewer than this many more replicas
	SpareEmpty int  `json:"spare_empty"` // more empty nodes listed from the leaf of the first to open
	Sticky     bool `json:"sticky"`      // the nodes listed now keep their places while they qualify
	KeepPairs  bool `json:"keep_pairs"`  // no partly used node whose taking costs its leaf a pair, while one that costs none has as much room
	KeepRuns   bool `json:"keep_runs"`   // --node-tier-keep-runs: runs of empty nodes kept for replicas of whole-node pods
}

// ShippedTier is what the operator runs (stormtopo/operator/node_tier.py, chart defaults: nodeTier.keepRuns
// false): tests/core/test_node_tier_parity.py requires the Python side's to equal it.
var ShippedTier = TierParams{PerFree: 2, NextEmpty: 1, SpareRuns: 6, SpareEmpty: 1, Sticky: true, KeepPairs: true, KeepRuns: false}

// WholeNodeRun is the most pods of one replica (the GPUs of each of its pods) that each take a whole node
// of nodeGPUs GPUs: such a replica needs a run of as many empty nodes in one leaf. 0 when no replica has
// two or more.
func WholeNodeRun(replicas [][]int, nodeGPUs int) int {
	if nodeGPUs <= 0 {
		return 0
	}
	most := 0
	for _, pods := range replicas {
		whole := 0
		for _, gpus := range pods {
			if gpus >= nodeGPUs {
				whole++
			}
		}
		most = max(most, whole)
	}
	if most >= 2 {
		return most
	}
	return 0
}

// Shortlist returns the nodes that get a tier-0 HyperNode, in stormtopo's order: the partly used nodes
// listed (per amount of free GPUs, fullest leaf first), then the next empty nodes to open (from the leaves
// with the fewest empty nodes), then the spare empty nodes of the first leaf to open. gpus: each node's
// GPUs; used: the GPUs in use per node; wholeRun: the most whole-node pods of a replica that asks for a
// topology (WholeNodeRun; used only with p.KeepRuns); keep: the nodes listed now (used only with p.Sticky).
func Shortlist(leaves []TierLeaf, gpus, used map[string]int, p TierParams, wholeRun int, keep map[string]bool) []string {
	if !p.KeepRuns {
		wholeRun = 0
	}
	if !p.Sticky {
		keep = nil
	}
	var withNodes []TierLeaf
	inLeaf := map[string]int{}
	for _, leaf := range leaves {
		if len(leaf.Nodes) == 0 {
			continue
		}
		withNodes = append(withNodes, leaf)
		for _, n := range leaf.Nodes {
			inLeaf[leaf.Name] += used[n]
		}
	}
	// Fullest leaf first (then by name): the order a best-fit packer fills leaves in.
	ordered := append([]TierLeaf(nil), withNodes...)
	sort.SliceStable(ordered, func(i, j int) bool {
		a, b := ordered[i], ordered[j]
		if inLeaf[a.Name] != inLeaf[b.Name] {
			return inLeaf[a.Name] > inLeaf[b.Name]
		}
		return a.Name < b.Name
	})
	var inOrder []string
	for _, leaf := range ordered {
		inOrder = append(inOrder, leaf.Nodes...)
	}
	costing, unlisted := map[string]bool{}, map[string]bool{}
	if p.KeepPairs {
		costing, unlisted = tierPairs(withNodes, gpus, used)
	}
	sort.SliceStable(inOrder, func(i, j int) bool { return !costing[inOrder[i]] && costing[inOrder[j]] })
	// The nodes listed now first, while they qualify.
	candidates := make([]string, 0, len(inOrder))
	for _, n := range inOrder {
		if keep[n] {
			candidates = append(candidates, n)
		}
	}
	for _, n := range inOrder {
		if !keep[n] {
			candidates = append(candidates, n)
		}
	}
	var listed []string
	perAmount := map[int]int{}
	for _, n := range candidates {
		u := used[n]
		free := gpus[n] - u
		if u > 0 && free > 0 && perAmount[free] < p.PerFree && !unlisted[n] {
			perAmount[free]++
			listed = append(listed, n)
		}
	}
	// Empty nodes; a run counts those of the largest size (a whole-node pod fits them).
	largest := 0
	for _, leaf := range withNodes {
		for _, n := range leaf.Nodes {
			largest = max(largest, gpus[n])
		}
	}
	empty := map[string][]string{}
	run := map[string]int{}
	for _, leaf := range withNodes {
		for _, n := range leaf.Nodes {
			if used[n] == 0 && gpus[n] > 0 {
				empty[leaf.Name] = append(empty[leaf.Name], n)
				if gpus[n] >= largest {
					run[leaf.Name]++
				}
			}
		}
	}
	room := 0 // replicas of wholeRun whole-node pods the runs hold
	if wholeRun > 0 {
		for _, leaf := range withNodes {
			room += run[leaf.Name] / wholeRun
		}
	}
	kept := func(leaf string) bool { // a run of 2..2k, while the other leaves' runs hold fewer than SpareRuns more
		r := run[leaf]
		return 2 <= r && r <= 2*wholeRun && room-r/wholeRun < p.SpareRuns
	}
	var opening []string
	for _, leaf := range ordered {
		if len(empty[leaf.Name]) > 0 && !kept(leaf.Name) {
			opening = append(opening, leaf.Name)
		}
	}
	sort.SliceStable(opening, func(i, j int) bool { return len(empty[opening[i]]) < len(empty[opening[j]]) })
	var nexts []string
	for _, leaf := range opening {
		for _, n := range empty[leaf] {
			if len(nexts) < p.NextEmpty {
				nexts = append(nexts, n)
			}
		}
	}
	var spares []string
	if len(opening) > 0 {
		inNexts := map[string]bool{}
		for _, n := range nexts {
			inNexts[n] = true
		}
		for _, n := range empty[opening[0]] {
			if !inNexts[n] && len(spares) < p.SpareEmpty {
				spares = append(spares, n)
			}
		}
	}
	out := append(listed, nexts...)
	return append(out, spares...)
}

// tierPairs is stormtopo's _pairs: the partly used nodes whose taking costs a pair (each one of an even
// number of nodes of the largest size with half a node free or more in its leaf), and of those the ones not
// listed (a node that costs none has as much room or more).
func tierPairs(leaves []TierLeaf, gpus, used map[string]int) (costing, unlisted map[string]bool) {
	largest := 0
	for _, leaf := range leaves {
		for _, n := range leaf.Nodes {
			largest = max(largest, gpus[n])
		}
	}
	half := largest / 2
	roomy := map[string][]string{}
	for _, leaf := range leaves {
		for _, n := range leaf.Nodes {
			u := used[n]
			if largest > 0 && gpus[n] == largest && 0 < u && u < gpus[n] && gpus[n]-u >= half {
				roomy[leaf.Name] = append(roomy[leaf.Name], n)
			}
		}
	}
	costing, unlisted = map[string]bool{}, map[string]bool{}
	most := -1
	for _, nodes := range roomy {
		for _, n := range nodes {
			if len(nodes)%2 == 0 {
				costing[n] = true
			} else {
				most = max(most, largest-used[n])
			}
		}
	}
	for n := range costing {
		if largest-used[n] <= most {
			unlisted[n] = true
		}
	}
	return costing, unlisted
}
