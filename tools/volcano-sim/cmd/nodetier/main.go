// Command nodetier runs the simulator's node-tier rule (package sim, nodetier.go) on JSON cases, for
// tests/core/test_node_tier_parity.py, which requires the same lists from stormtopo's Python rule.
//
//	nodetier < cases.json   {"cases": [case, ...]} -> {"lists": [[node, ...], ...]}, one list per case
//	nodetier -shipped       the parameters the operator ships (sim.ShippedTier)
//
// A case: {"leaves": [{"name", "nodes"}], "gpus": {node: n}, "used": {node: n}, "params": sim.TierParams,
// "replicas": [[gpus per pod], ...], "keep": [node, ...]}. The run of whole-node pods is taken from the
// replicas and the largest node of the leaves, as the operator does.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"stormtopo.local/tools/volcano-sim/sim"
)

type tierCase struct {
	Leaves   []sim.TierLeaf `json:"leaves"`
	GPUs     map[string]int `json:"gpus"`
	Used     map[string]int `json:"used"`
	Params   sim.TierParams `json:"params"`
	Replicas [][]int        `json:"replicas"`
	Keep     []string       `json:"keep"`
}

func main() {
	shipped := flag.Bool("shipped", false, "print the parameters the operator ships")
	flag.Parse()
	out := json.NewEncoder(os.Stdout)
	if *shipped {
		must(out.Encode(sim.ShippedTier))
		return
	}
	var in struct {
		Cases []tierCase `json:"cases"`
	}
	dec := json.NewDecoder(os.Stdin)
	dec.DisallowUnknownFields()
	must(dec.Decode(&in))
	lists := make([][]string, 0, len(in.Cases))
	for _, c := range in.Cases {
		largest := 0
		for _, leaf := range c.Leaves {
			for _, n := range leaf.Nodes {
				largest = max(largest, c.GPUs[n])
			}
		}
		keep := map[string]bool{}
		for _, n := range c.Keep {
			keep[n] = true
		}
		list := sim.Shortlist(c.Leaves, c.GPUs, c.Used, c.Params, sim.WholeNodeRun(c.Replicas, largest), keep)
		lists = append(lists, append([]string{}, list...))
	}
	must(out.Encode(map[string]any{"lists": lists}))
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodetier:", err)
		os.Exit(1)
	}
}
