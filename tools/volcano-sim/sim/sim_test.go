package sim

// The scale simulator of `make bench-sim` (driven by bench/sim.py, which writes the spec and reads the results).
//
// Volcano v1.15.1's own scheduler cache, session, allocate action and plugins (configured from the scheduler
// conf the dev cluster ships, stormtopo/devenv/cluster.py) place a seeded stream of replicas (gangs) on a
// synthetic fabric, one gang per scheduling session, as replicas arrive one at a time in the packing bench.
// Nothing is mocked but the API server: binds go to a recording binder, and the cache keeps each bound pod
// on its node for the next session, as the real cache does between a bind and the pod's watch event.
// Before each session the HyperNodes of the layout under test are recomputed from the cluster's state,
// as stormtopo's operator would keep them (the simulator assumes it is never late).

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	schedulingv1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
	topologyv1alpha1 "volcano.sh/apis/pkg/apis/topology/v1alpha1"
	"volcano.sh/volcano/cmd/scheduler/app/options"
	vcscheduler "volcano.sh/volcano/pkg/scheduler"
	_ "volcano.sh/volcano/pkg/scheduler/actions" // registers the actions the conf names
	"volcano.sh/volcano/pkg/scheduler/actions/allocate"
	"volcano.sh/volcano/pkg/scheduler/api"
	"volcano.sh/volcano/pkg/scheduler/cache"
	"volcano.sh/volcano/pkg/scheduler/conf"
	"volcano.sh/volcano/pkg/scheduler/framework"
	"volcano.sh/volcano/pkg/scheduler/metrics"
	_ "volcano.sh/volcano/pkg/scheduler/plugins" // registers the plugins the conf names
	"volcano.sh/volcano/pkg/scheduler/util"
)

const (
	namespace  = "sim"
	queueName  = "q1"
	nodeCPU    = 96 // as stormtopo's topology format's node defaults (stormtopo/core/topology/fabric.py)
	nodeMemGiB = 1024
)

// Spec is what bench/sim.py asks for (JSON in $SIM_SPEC).
type Spec struct {
	SchedulerConf string    `json:"scheduler_conf"`
	Cases         []Case    `json:"cases"`
	Settings      []Setting `json:"settings"`
	Out           string    `json:"out"`
}

type Case struct {
	Name           string   `json:"name"`
	Nodes          int      `json:"nodes"`
	LeafSize       int      `json:"leaf_size"`
	LeavesPerSpine int      `json:"leaves_per_spine"`
	NodeGPUs       int      `json:"node_gpus"`
	Start          string   `json:"start"`     // "empty" or "fragmented"
	InitUsed       []int    `json:"init_used"` // GPUs busy per node at the start (bench.fabric.fragmentation)
	Gangs          []gang   `json:"gangs"`     // the stream (bench.packing.arrivals), with a hard tier-1 topology
	Normal         []gang   `json:"normal"`    // gangs without a topology, placed after the stream
	Layouts        []string `json:"layouts"`
	BucketPerFree  int      `json:"bucket_per_free"`
	Batch          int      `json:"batch"`      // replicas per scheduling session (1: each arrives after the previous is bound)
	NextEmpty      int      `json:"next_empty"` // empty nodes node-partial-next and node-bucket offer at tier 0
	// SpareEmpty: more empty nodes of the first leaf to open, listed too (stormtopo's SPARE_EMPTY, 1): on a
	// real cluster a replica arriving before the list catches up with the previous one still finds one.
	SpareEmpty int  `json:"spare_empty"`
	Sticky     bool `json:"sticky"` // partly used nodes listed before stay listed while they qualify (fewer writes)
	// stormtopo's rule (core/topology/node_tier.py) is "fewest-pairs" since 2026-12-02 ("-pairs" with
	// --node-tier-keep-runs); "" was its rule before.
	// Which empty nodes node-partial-next and node-bucket offer. "" (stormtopo's rule before, --node-tier-keep-runs without pairs):
	// from the leaves with the fewest empty nodes, but once a gang of k >= 2 whole-node pods has arrived, not
	// from a leaf with 2..2k empty nodes (a leaf keeps its run while it is room for at most two such gangs)
	// unless the other leaves' runs hold 6 or more such gangs ("spare-runs-N": N instead of 6). "runs-2k":
	// the rule before, keeping every run of 2..2k. "fewest": the rule before that, blind to whole-node gangs.
	// "keep-all": no leaf with 2 or more empty nodes once such a gang has arrived. "keep-runs-upto": no leaf
	// with 2..k. "per-size[N]": runs keep room for N (2) gangs of each k seen, a free opening first.
	// "-lonely", "fewest-lonely": "" or "fewest", with the partly used nodes alone in their leaf with as much
	// room listed first (tried, not shipped: no better in 12 streams x 3, bench/results/sim-fewest-lonely.md).
	// "-pairs", "fewest-pairs": "" or "fewest", with a partly used node not listed where taking it costs its
	// leaf a pair of nodes with half a node free while a node that costs none has as much room (stormtopo's).
	Opening string `json:"opening"`
}

type Setting struct {
	Name string `json:"name"`
	// Arguments replacing or adding to network-topology-aware's in the shipped conf.
	Args map[string]any `json:"args"`
}

// GangResult is one replica of the stream.
type GangResult struct {
	Kind        string   `json:"kind"`
	GPUs        int      `json:"gpus"`
	Placed      bool     `json:"placed"`
	OneNode     bool     `json:"one_node"`
	OneLeaf     bool     `json:"one_leaf"`
	FitsNode    bool     `json:"fits_node"`
	FitsFree    bool     `json:"fits_free_node"` // a node had room for the whole gang when it arrived
	OpenedNodes int      `json:"opened_nodes"`
	OpenedLeafs int      `json:"opened_leaves"`
	AllocateSec float64  `json:"allocate_s"`
	HyperNodes  int      `json:"hypernodes"`
	Nodes       []string `json:"nodes,omitempty"` // where its pods went, one per pod (any order)
}

type Optimum struct {
	OneNodeUpper    int  `json:"one_node_upper"`    // gangs whose pods fit one node at all
	OneNodeGreedy   int  `json:"one_node_greedy"`   // the offline best-fit witness
	UsedNodesLower  int  `json:"used_nodes_lower"`  // nodes in use at the end, lower bound
	UsedNodesGreedy int  `json:"used_nodes_greedy"` // ... in the witness
	UsedLeafsLower  int  `json:"used_leaves_lower"`
	UsedLeafsGreedy int  `json:"used_leaves_greedy"`
	GreedyPlaced    int  `json:"greedy_placed"`
	Exact           bool `json:"exact"` // the witness meets every bound
}

type Result struct {
	Case       string       `json:"case"`
	Nodes      int          `json:"nodes"`
	Start      string       `json:"start"`
	Layout     string       `json:"layout"`
	Setting    string       `json:"setting"`
	Gangs      []GangResult `json:"gangs"`
	NormalSec  []float64    `json:"normal_allocate_s"`
	NormalOK   int          `json:"normal_placed"`
	NormalOpen int          `json:"normal_opened_nodes"` // empty nodes the gangs without a topology opened
	UsedNodes  int          `json:"used_nodes"`
	UsedLeafs  int          `json:"used_leaves"`
	InitNodes  int          `json:"initially_used_nodes"`
	InitLeafs  int          `json:"initially_used_leaves"`
	Optimum    Optimum      `json:"optimum"`
	SetupSec   float64      `json:"setup_s"`
	SessionSec float64      `json:"sessions_s"`
	// ListChanges: tier-0 HyperNodes created or deleted from one session's list to the next (node
	// tier layouts): about the HyperNode writes the operator makes, two or three per change.
	ListChanges int `json:"list_changes"`
}

func TestMain(m *testing.M) {
	options.Default()
	metrics.InitKubeSchedulerRelatedMetrics() // the kube-scheduler plugins Volcano's predicates call report to these
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	// volcano.sh/apis v1.14.0's fake clientset never sends the watch-list bookmark; without this the
	// mock cache's informers wait forever.
	if err := utilfeature.DefaultMutableFeatureGate.Set("WatchListClient=false"); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// ---- the fabric and the stream -------------------------------------------------------------------------

type fabric struct {
	c        Case
	nodes    []string
	leafOf   map[string]string
	leaves   []string
	nodesOf  map[string][]string
	spineOf  map[string]string
	spines   []string
	initUsed map[string]int // GPUs busy at the start
	// The same, as Shortlist (nodetier.go) takes it: the leaves and their nodes, every node's GPUs.
	tierLeaves []TierLeaf
	gpus       map[string]int
}

func newFabric(c Case) *fabric {
	f := &fabric{c: c, leafOf: map[string]string{}, nodesOf: map[string][]string{}, spineOf: map[string]string{}, initUsed: map[string]int{}}
	for i := 0; i < c.Nodes; i++ {
		leaf := fmt.Sprintf("leaf-%04d", i/c.LeafSize)
		if len(f.nodesOf[leaf]) == 0 {
			f.leaves = append(f.leaves, leaf)
			spine := fmt.Sprintf("spine-%03d", (i/c.LeafSize)/c.LeavesPerSpine)
			if len(f.spines) == 0 || f.spines[len(f.spines)-1] != spine {
				f.spines = append(f.spines, spine)
			}
			f.spineOf[leaf] = spine
		}
		n := fmt.Sprintf("node-%05d", i)
		f.nodes = append(f.nodes, n)
		f.leafOf[n] = leaf
		f.nodesOf[leaf] = append(f.nodesOf[leaf], n)
		if i < len(c.InitUsed) {
			f.initUsed[n] = c.InitUsed[i]
		}
	}
	f.gpus = map[string]int{}
	for _, leaf := range f.leaves {
		f.tierLeaves = append(f.tierLeaves, TierLeaf{Name: leaf, Nodes: f.nodesOf[leaf]})
		for _, n := range f.nodesOf[leaf] {
			f.gpus[n] = c.NodeGPUs
		}
	}
	return f
}

type gang struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	Pods []int  `json:"pods"` // GPUs per pod, prefill first
}

func (g gang) gpus() int {
	s := 0
	for _, p := range g.Pods {
		s += p
	}
	return s
}

// A replica's pod asks its GPUs and 1 CPU, as stormtopo/devenv/workloads.py; a filler only GPUs.
func resources(gpus int, cpu string) v1.ResourceList {
	return api.BuildResourceList(cpu, "", api.ScalarResource{Name: "nvidia.com/gpu", Value: fmt.Sprint(gpus)})
}

func podsOf(g gang) []*v1.Pod {
	var pods []*v1.Pod
	for i, gpus := range g.Pods {
		role := "decode"
		if i < len(g.Pods)-1 {
			role = "prefill"
		}
		p := util.BuildPod(namespace, fmt.Sprintf("%s-%d-%s", g.Name, i, role), "", v1.PodPending, resources(gpus, "1"), g.Name,
			map[string]string{"stormtopo.io/replica": g.Name}, nil)
		p.CreationTimestamp = metav1.NewTime(time.Unix(int64(i), 0))
		pods = append(pods, p)
	}
	return pods
}

// ---- HyperNode layouts ---------------------------------------------------------------------------------

type layoutState struct {
	hns     map[string]*api.HyperNodeInfo
	byTier  map[int]sets.Set[string]
	real    map[string]sets.Set[string]
	members map[string][]api.MemberConfig
}

func (s *layoutState) add(name string, tier int, members []api.MemberConfig, nodes sets.Set[string]) {
	if s.byTier[tier] == nil {
		s.byTier[tier] = sets.New[string]()
	}
	s.byTier[tier].Insert(name)
	s.hns[name] = api.NewHyperNodeInfo(api.BuildHyperNode(name, tier, members))
	s.real[name] = nodes
}

func member(name string, t topologyv1alpha1.MemberType) api.MemberConfig {
	return api.MemberConfig{Name: name, Type: t, Selector: "exact"}
}

// nodeTier returns the nodes that get a tier-0 HyperNode of their own under this layout.
//   - leaf:               none (what stormtopo renders today).
//   - node-all:           every node.
//   - node-partial:       nodes already partly used, so an empty node opens only through the leaf's choice.
//   - node-partial-next:  those plus the next empty node(s) to open: the first empty nodes of the leaves with
//     the fewest empty nodes (then the fullest), so a replica that fits an empty node gets one where no
//     replica of whole-node pods could use it; once such a replica (two or more whole-node pods, the most
//     of them `wholeRun`) has arrived, none from a leaf whose run is room for at most two while the other
//     leaves' runs are room for fewer than six more (Case.Opening).
//   - node-bucket:        node-partial-next, but of the partly used nodes only `bucket_per_free` for each amount of
//     free GPUs (in the fullest leaves): nodes with the same free GPUs are interchangeable for a replica that
//     must fit one node, and the scheduler's work grows with the number of HyperNodes.
//
// stormtopo's rule (Shortlist, nodetier.go: the same code for the simulator and the parity test against
// stormtopo/core/topology/node_tier.py) chooses both halves of node-bucket and the empty nodes of
// node-partial-next, for every opening but the experiments that were not shipped (tierOpening).
func (f *fabric) nodeTier(layout string, used map[string]int, wholeRuns []int, prev sets.Set[string]) []string {
	wholeRun := 0
	for _, k := range wholeRuns {
		wholeRun = max(wholeRun, k)
	}
	gpus := f.c.NodeGPUs
	partly := func(n string) bool { return used[n] > 0 && used[n] < gpus }
	params := f.tierParams()
	keep := map[string]bool{}
	for n := range prev {
		keep[n] = true
	}
	// The next empty nodes to open: `next_empty` of them (one per replica that may arrive in one session; 1
	// when replicas arrive one at a time), from the leaves with the fewest empty nodes first, then the
	// fullest (stormtopo's rule, with no partly used node listed), or an experiment's.
	next := func() []string {
		if tierOpening(f.c.Opening) {
			p := params
			p.PerFree = 0
			return Shortlist(f.tierLeaves, f.gpus, used, p, wholeRun, nil)
		}
		return f.experimentalOpening(used, wholeRun, wholeRuns)
	}
	var out []string
	switch layout {
	case "leaf":
	case "node-all":
		out = append(out, f.nodes...)
	case "node-partial", "node-partial-next":
		for _, n := range f.nodes {
			if partly(n) {
				out = append(out, n)
			}
		}
		if layout == "node-partial-next" {
			out = append(out, next()...)
		}
	case "node-bucket":
		if strings.HasSuffix(f.c.Opening, "-lonely") {
			out = f.lonelyBucket(used, prev)
		} else {
			// stormtopo's partly used nodes (no empty node listed), with pairs kept where the opening says so.
			p := params
			p.NextEmpty, p.SpareEmpty = 0, 0
			out = Shortlist(f.tierLeaves, f.gpus, used, p, wholeRun, keep)
		}
		out = append(out, next()...)
	default:
		panic("unknown layout " + layout)
	}
	return out
}

// tierOpening: the openings that are stormtopo's rule, Shortlist's ("" and "-pairs": runs kept for
// replicas of whole-node pods, as --node-tier-keep-runs; "fewest" and "fewest-pairs": not, as shipped;
// "spare-runs-N": "" with N for SpareRuns; "-lonely" and "fewest-lonely" open as "" and "fewest").
func tierOpening(opening string) bool {
	base := strings.TrimSuffix(strings.TrimSuffix(opening, "-pairs"), "-lonely")
	n, spare := strings.CutPrefix(base, "spare-runs-")
	if spare {
		_, err := strconv.Atoi(n)
		return err == nil
	}
	return base == "" || base == "fewest"
}

// tierParams: the case's parameters for Shortlist (bucket_per_free 0 for 2 and next_empty 0 for 1, as
// bench/sim.py writes them).
func (f *fabric) tierParams() TierParams {
	p := TierParams{PerFree: f.c.BucketPerFree, NextEmpty: max(f.c.NextEmpty, 1), SpareRuns: ShippedTier.SpareRuns, SpareEmpty: f.c.SpareEmpty, Sticky: f.c.Sticky}
	if p.PerFree <= 0 {
		p.PerFree = 2
	}
	base, pairs := strings.CutSuffix(f.c.Opening, "-pairs")
	base = strings.TrimSuffix(base, "-lonely")
	p.KeepPairs = pairs
	p.KeepRuns = base != "fewest"
	if n, ok := strings.CutPrefix(base, "spare-runs-"); ok {
		p.SpareRuns, _ = strconv.Atoi(n)
	}
	return p
}

// experimentalOpening: the next empty nodes to open under the openings tried and not shipped (Case.Opening:
// keep-all, keep-runs-upto, runs-2k, per-size[N]).
func (f *fabric) experimentalOpening(used map[string]int, wholeRun int, wholeRuns []int) []string {
	empty, leafUsed := map[string]int{}, map[string]int{}
	for _, n := range f.nodes {
		leafUsed[f.leafOf[n]] += used[n]
		if used[n] == 0 {
			empty[f.leafOf[n]]++
		}
	}
	// Leaves fullest first, then by name; then the fewest empty nodes first.
	opening := append([]string(nil), f.leaves...)
	sort.SliceStable(opening, func(i, j int) bool { return leafUsed[opening[i]] > leafUsed[opening[j]] })
	sort.SliceStable(opening, func(i, j int) bool { return empty[opening[i]] < empty[opening[j]] })
	if spare, ok := strings.CutPrefix(f.c.Opening, "per-size"); ok {
		keep := 2
		if spare != "" {
			keep, _ = strconv.Atoi(spare)
		}
		return f.spareOpening(opening, empty, used, wholeRuns, keep)
	}
	var out []string
	for _, leaf := range opening {
		if f.c.Opening == "keep-runs-upto" && wholeRun >= 2 && empty[leaf] >= 2 && empty[leaf] <= wholeRun {
			continue
		}
		if f.c.Opening == "runs-2k" && wholeRun >= 2 && empty[leaf] >= 2 && empty[leaf] <= 2*wholeRun {
			continue
		}
		if f.c.Opening == "keep-all" && wholeRun >= 2 && empty[leaf] >= 2 {
			continue
		}
		first := len(out) == 0
		for _, n := range f.nodesOf[leaf] {
			if used[n] == 0 && (len(out) < max(f.c.NextEmpty, 1) || first && len(out) < max(f.c.NextEmpty, 1)+f.c.SpareEmpty) {
				out = append(out, n)
			}
		}
	}
	return out
}

// lonelyBucket: node-bucket's partly used nodes under "-lonely" and "fewest-lonely" (tried, not shipped:
// no better in 12 streams x 3, bench/results/sim-fewest-lonely.md): the nodes alone in their leaf with as
// much room first, so that a leaf's several roomy nodes are kept for a replica that must be split over them.
func (f *fabric) lonelyBucket(used map[string]int, prev sets.Set[string]) []string {
	gpus := f.c.NodeGPUs
	partly := func(n string) bool { return used[n] > 0 && used[n] < gpus }
	per := f.c.BucketPerFree
	if per <= 0 {
		per = 2
	}
	leafUsed := map[string]int{}
	for _, n := range f.nodes {
		leafUsed[f.leafOf[n]] += used[n]
	}
	leaves := append([]string(nil), f.leaves...)
	sort.SliceStable(leaves, func(i, j int) bool { return leafUsed[leaves[i]] > leafUsed[leaves[j]] })
	candidates := []string{} // fullest leaf first
	for _, leaf := range leaves {
		candidates = append(candidates, f.nodesOf[leaf]...)
	}
	roomy := func(n string) int {
		c := 0
		for _, m := range f.nodesOf[f.leafOf[n]] {
			if gpus-used[m] >= gpus-used[n] {
				c++
			}
		}
		return c
	}
	sort.SliceStable(candidates, func(i, j int) bool { return roomy(candidates[i]) < roomy(candidates[j]) })
	var out []string
	taken := map[int]int{}
	listed := sets.New[string]()
	// Case.Sticky: the partly used nodes listed before keep their places while they qualify.
	for pass := 0; pass < 2; pass++ {
		for _, n := range candidates {
			if pass == 0 && (!f.c.Sticky || !prev.Has(n)) || listed.Has(n) {
				continue
			}
			if free := gpus - used[n]; partly(n) && taken[free] < per {
				taken[free]++
				listed.Insert(n)
				out = append(out, n)
			}
		}
	}
	return out
}

// spareOpening is the "per-size[N]" rule (tried, not shipped: it packed worse from a fragmented start): the next empty nodes to open, from `opening` (the leaves in the order
// to try), so that the runs of empty nodes keep room for at least `spareRuns` gangs of each number k of
// whole-node pods seen (room: the sum over leaves of ⌊empty/k⌋). A leaf whose next opening costs no
// room (its empty nodes not a multiple of any k) comes first.
func (f *fabric) spareOpening(opening []string, empty, used map[string]int, wholeRuns []int, spareRuns int) []string {
	left := map[string]int{}
	room := map[int]int{}
	for _, leaf := range opening {
		left[leaf] = empty[leaf]
		for _, k := range wholeRuns {
			room[k] += empty[leaf] / k
		}
	}
	costs := func(leaf string) []int { // the ks whose room one more opening in this leaf takes
		var out []int
		for _, k := range wholeRuns {
			if (left[leaf]-1)/k < left[leaf]/k {
				out = append(out, k)
			}
		}
		return out
	}
	var out []string
	for len(out) < max(f.c.NextEmpty, 1) {
		best := ""
		for _, leaf := range opening {
			if left[leaf] == 0 {
				continue
			}
			cost := costs(leaf)
			allowed := true
			for _, k := range cost {
				allowed = allowed && room[k]-1 >= spareRuns
			}
			if !allowed {
				continue
			}
			if best == "" || (len(cost) == 0 && len(costs(best)) > 0) {
				best = leaf
			}
		}
		if best == "" {
			break
		}
		for _, k := range costs(best) {
			room[k]--
		}
		taken := empty[best] - left[best]
		left[best]--
		for _, n := range f.nodesOf[best] {
			if used[n] == 0 {
				if taken == 0 {
					out = append(out, n)
					break
				}
				taken--
			}
		}
	}
	return out
}

// hyperNodes builds the layout: tier 0 = a node's own HyperNode (where the layout gives one), tier 1 = leaf,
// tier 2 = spine, tier 3 = the fabric when there is more than one spine. Tier 1 stays the leaf in every layout.
func (f *fabric) hyperNodes(layout string, used map[string]int, wholeRuns []int, prev sets.Set[string]) (*api.HyperNodesInfo, int, sets.Set[string]) {
	s := &layoutState{hns: map[string]*api.HyperNodeInfo{}, byTier: map[int]sets.Set[string]{}, real: map[string]sets.Set[string]{}}
	own := sets.New(f.nodeTier(layout, used, wholeRuns, prev)...)
	spineMembers := map[string][]api.MemberConfig{}
	spineNodes := map[string]sets.Set[string]{}
	all := sets.New[string]()
	for _, leaf := range f.leaves {
		var members []api.MemberConfig
		for _, n := range f.nodesOf[leaf] {
			if own.Has(n) {
				s.add("hn-"+n, 0, []api.MemberConfig{member(n, topologyv1alpha1.MemberTypeNode)}, sets.New(n))
				members = append(members, member("hn-"+n, topologyv1alpha1.MemberTypeHyperNode))
			} else {
				members = append(members, member(n, topologyv1alpha1.MemberTypeNode))
			}
		}
		nodes := sets.New(f.nodesOf[leaf]...)
		s.add(leaf, 1, members, nodes)
		spine := f.spineOf[leaf]
		spineMembers[spine] = append(spineMembers[spine], member(leaf, topologyv1alpha1.MemberTypeHyperNode))
		if spineNodes[spine] == nil {
			spineNodes[spine] = sets.New[string]()
		}
		spineNodes[spine].Insert(f.nodesOf[leaf]...)
		all.Insert(f.nodesOf[leaf]...)
	}
	var top []api.MemberConfig
	for _, spine := range f.spines {
		s.add(spine, 2, spineMembers[spine], spineNodes[spine])
		top = append(top, member(spine, topologyv1alpha1.MemberTypeHyperNode))
	}
	if len(f.spines) > 1 {
		s.add("fabric", 3, top, all)
	}
	// Parent and children from the members, as uthelper and the HyperNode informer do.
	for _, hni := range s.hns {
		for _, m := range hni.HyperNode.Spec.Members {
			if m.Type != topologyv1alpha1.MemberTypeHyperNode || m.Selector.ExactMatch == nil {
				continue
			}
			hni.Children.Insert(m.Selector.ExactMatch.Name)
			if child, ok := s.hns[m.Selector.ExactMatch.Name]; ok {
				child.Parent = hni.Name
			}
		}
	}
	ready := new(atomic.Bool)
	ready.Store(true)
	return api.NewHyperNodesInfoWithCache(s.hns, s.byTier, s.real, ready), len(s.hns), own
}

// ---- the offline optimum -------------------------------------------------------------------------------

// optimum: the bounds every placement of the stream obeys, and an offline best-fit witness that meets them.
//   - one_node_upper: gangs whose pods fit one empty node; no placement puts more on one node.
//   - used_nodes_lower: nodes in use at the start + ceil((GPUs asked - free GPUs on nodes in use) / GPUs per
//     node), as no node holds more than it has; the same per leaf.
//   - the witness: each gang that fits one node goes to the node with the fewest free GPUs that holds it
//     (fullest leaf first on ties); any other to the fullest leaf that holds it, each pod best fit.
//
// When the witness reaches every bound (Exact), the bounds are the optimum; else they are still bounds.
func (f *fabric) optimum(gangs []gang) Optimum {
	gpus := f.c.NodeGPUs
	used := map[string]int{}
	for n, u := range f.initUsed {
		used[n] = u
	}
	var o Optimum
	demand, freeOnUsed, freeOnUsedLeaves, initNodes := 0, 0, 0, 0
	leafUsed := map[string]int{}
	for _, n := range f.nodes {
		leafUsed[f.leafOf[n]] += used[n]
		if used[n] > 0 {
			initNodes++
			freeOnUsed += gpus - used[n]
		}
	}
	initLeaves := 0
	for _, leaf := range f.leaves {
		if leafUsed[leaf] > 0 {
			initLeaves++
			freeOnUsedLeaves += len(f.nodesOf[leaf])*gpus - leafUsed[leaf]
		}
	}
	for _, g := range gangs {
		demand += g.gpus()
		if g.gpus() <= gpus {
			o.OneNodeUpper++
		}
	}
	ceilDiv := func(a, b int) int {
		if a <= 0 {
			return 0
		}
		return (a + b - 1) / b
	}
	o.UsedNodesLower = initNodes + ceilDiv(demand-freeOnUsed, gpus)
	o.UsedLeafsLower = initLeaves + ceilDiv(demand-freeOnUsedLeaves, gpus*f.c.LeafSize)

	for _, g := range gangs {
		leaves := append([]string(nil), f.leaves...)
		sort.SliceStable(leaves, func(i, j int) bool { return leafUsed[leaves[i]] > leafUsed[leaves[j]] })
		placed := false
		if g.gpus() <= gpus {
			best, bestFree := "", gpus+1
			for _, leaf := range leaves {
				for _, n := range f.nodesOf[leaf] {
					if free := gpus - used[n]; free >= g.gpus() && free < bestFree {
						best, bestFree = n, free
					}
				}
			}
			if best != "" {
				used[best] += g.gpus()
				leafUsed[f.leafOf[best]] += g.gpus()
				o.OneNodeGreedy++
				placed = true
			}
		}
		if !placed {
			pods := append([]int(nil), g.Pods...)
			sort.Sort(sort.Reverse(sort.IntSlice(pods)))
			for _, leaf := range leaves {
				trial := map[string]int{}
				ok := true
				for _, p := range pods {
					best, bestFree := "", gpus+1
					for _, n := range f.nodesOf[leaf] {
						if free := gpus - used[n] - trial[n]; free >= p && free < bestFree {
							best, bestFree = n, free
						}
					}
					if best == "" {
						ok = false
						break
					}
					trial[best] += p
				}
				if ok {
					for n, p := range trial {
						used[n] += p
						leafUsed[leaf] += p
					}
					placed = true
					break
				}
			}
		}
		if placed {
			o.GreedyPlaced++
		}
	}
	for _, n := range f.nodes {
		if used[n] > 0 {
			o.UsedNodesGreedy++
		}
	}
	for _, leaf := range f.leaves {
		if leafUsed[leaf] > 0 {
			o.UsedLeafsGreedy++
		}
	}
	o.Exact = o.OneNodeGreedy == o.OneNodeUpper && o.UsedNodesGreedy == o.UsedNodesLower &&
		o.UsedLeafsGreedy == o.UsedLeafsLower && o.GreedyPlaced == len(gangs)
	return o
}

// ---- running Volcano -----------------------------------------------------------------------------------

type recordingBinder struct {
	mu    sync.Mutex
	binds int
}

func (b *recordingBinder) Bind(_ kubernetes.Interface, tasks []*api.TaskInfo) map[api.TaskID]string {
	b.mu.Lock()
	b.binds += len(tasks)
	b.mu.Unlock()
	return nil
}

func loadTiers(t *testing.T, confText string, s Setting) ([]conf.Tier, []conf.Configuration) {
	_, tiers, configs, _, err := vcscheduler.UnmarshalSchedulerConf(confText)
	if err != nil {
		t.Fatalf("scheduler conf: %v", err)
	}
	found := false
	for i := range tiers {
		for j := range tiers[i].Plugins {
			p := &tiers[i].Plugins[j]
			if p.Name != "network-topology-aware" {
				continue
			}
			found = true
			args := framework.Arguments{}
			for k, v := range p.Arguments {
				args[k] = v
			}
			for k, v := range s.Args {
				if f, ok := v.(float64); ok && f == math.Trunc(f) {
					v = int(f) // JSON numbers; the plugin reads its weights as ints
				}
				args[k] = v
			}
			p.Arguments = args
		}
	}
	if !found {
		t.Fatalf("the scheduler conf has no network-topology-aware plugin")
	}
	return tiers, configs
}

func newCache(f *fabric) *cache.SchedulerCache {
	sc := cache.NewCustomMockSchedulerCache("sim", &recordingBinder{}, util.NewFakeEvictor(0), &util.FakeStatusUpdater{}, nil, &record.FakeRecorder{})
	stop := make(chan struct{})
	sc.Run(stop)
	sc.WaitForCacheSync(stop)
	alloc := api.BuildResourceList(fmt.Sprint(nodeCPU), fmt.Sprintf("%dGi", nodeMemGiB),
		api.ScalarResource{Name: "nvidia.com/gpu", Value: fmt.Sprint(f.c.NodeGPUs)}, api.ScalarResource{Name: "pods", Value: "110"})
	for _, n := range f.nodes {
		sc.AddOrUpdateNode(util.BuildNode(n, alloc, map[string]string{"kubernetes.io/hostname": n}))
	}
	sc.AddQueueV1beta1(util.BuildQueue(queueName, 1, nil))
	sc.AddPodGroupV1beta1(util.BuildPodGroup("busy", namespace, queueName, 1, nil, schedulingv1.PodGroupRunning))
	for _, n := range f.nodes {
		if u := f.initUsed[n]; u > 0 {
			sc.AddPod(util.BuildPod(namespace, "busy-"+n, n, v1.PodRunning, resources(u, ""), "busy", nil, nil))
		}
	}
	return sc
}

// schedule adds gangs and runs one session with the allocate action; returns where each gang's pods went
// (gang name -> nodes, one per bound pod) and how long the action took.
func schedule(sc *cache.SchedulerCache, tiers []conf.Tier, configs []conf.Configuration, gangs []gang, hard bool) (map[string][]string, float64) {
	for _, g := range gangs {
		var pg *schedulingv1.PodGroup
		if hard {
			pg = util.BuildPodGroupWithNetWorkTopologies(g.Name, namespace, "", queueName, int32(len(g.Pods)), nil,
				schedulingv1.PodGroupInqueue, "hard", 1)
		} else {
			pg = util.BuildPodGroup(g.Name, namespace, queueName, int32(len(g.Pods)), nil, schedulingv1.PodGroupInqueue)
		}
		sc.AddPodGroupV1beta1(pg)
		for _, p := range podsOf(g) {
			sc.AddPod(p)
		}
	}
	ssn := framework.OpenSession(sc, tiers, configs)
	action := allocate.New()
	action.Initialize()
	start := time.Now()
	action.Execute(ssn)
	elapsed := time.Since(start).Seconds()
	action.UnInitialize()
	out := map[string][]string{}
	for _, g := range gangs {
		if job := ssn.Jobs[api.JobID(namespace+"/"+g.Name)]; job != nil {
			for _, task := range job.Tasks {
				if task.NodeName != "" && (task.Status == api.Binding || task.Status == api.Allocated || task.Status == api.Bound) {
					out[g.Name] = append(out[g.Name], task.NodeName)
				}
			}
		}
	}
	framework.CloseSession(ssn)
	return out, elapsed
}

// runner is one (setting, layout) on its own copy of the cluster. The runners of a fabric take turns, one
// session each, so that every layout sees the same load on a shared machine when its time is taken.
type runner struct {
	f       *fabric
	c       Case
	layout  string
	tiers   []conf.Tier
	configs []conf.Configuration
	sc      *cache.SchedulerCache
	used    map[string]int
	gpusOf  map[string]int
	// wholeRuns: the numbers of whole-node pods (two or more) of the gangs of sessions before (the operator
	// knows a StormService as soon as it exists, possibly a session earlier; every node here has NodeGPUs).
	wholeRuns []int
	listed    sets.Set[string] // the node tier of the session before (Case.Sticky)
	res       Result
	started   time.Time
}

func newRunner(t *testing.T, spec Spec, c Case, f *fabric, layout string, s Setting) *runner {
	tiers, configs := loadTiers(t, spec.SchedulerConf, s)
	start := time.Now()
	r := &runner{f: f, c: c, layout: layout, tiers: tiers, configs: configs, sc: newCache(f), used: map[string]int{}, gpusOf: map[string]int{}}
	r.res = Result{Case: c.Name, Nodes: c.Nodes, Start: c.Start, Layout: layout, Setting: s.Name, SetupSec: time.Since(start).Seconds()}
	for n, u := range f.initUsed {
		r.used[n] = u
	}
	for _, g := range append(append([]gang(nil), c.Gangs...), c.Normal...) {
		for i, p := range podsOf(g) {
			r.gpusOf[p.Name] = g.Pods[i]
		}
	}
	return r
}

// session renders the layout from the state before it (as the operator would have), runs one allocate
// session for these gangs, and books where Volcano put their pods.
func (r *runner) session(chunk []gang, hard bool) (map[string][]string, float64, int) {
	info, count, listed := r.f.hyperNodes(r.layout, r.used, r.wholeRuns, r.listed)
	if r.listed != nil {
		r.res.ListChanges += listed.Difference(r.listed).Len() + r.listed.Difference(listed).Len()
	}
	r.listed = listed
	r.sc.HyperNodesInfo = info
	conf.EnabledActionMap = map[string]bool{"enqueue": true, "allocate": true, "backfill": true}
	where, seconds := schedule(r.sc, r.tiers, r.configs, chunk, hard)
	return where, seconds, count
}

func (r *runner) book(g gang) {
	for n, gpus := range placedGPUs(r.sc, g, r.gpusOf) {
		r.used[n] += gpus
	}
}

func (r *runner) replicas(chunk []gang) {
	f := r.f
	where, seconds, count := r.session(chunk, true)
	for _, g := range chunk {
		leafWasUsed := map[string]bool{}
		for _, n := range f.nodes {
			if r.used[n] > 0 {
				leafWasUsed[f.leafOf[n]] = true
			}
		}
		gr := GangResult{Kind: g.Kind, GPUs: g.gpus(), FitsNode: g.gpus() <= r.c.NodeGPUs, AllocateSec: seconds / float64(len(chunk)), HyperNodes: count}
		for _, n := range f.nodes {
			gr.FitsFree = gr.FitsFree || r.c.NodeGPUs-r.used[n] >= g.gpus()
		}
		if p := where[g.Name]; len(p) == len(g.Pods) {
			gr.Placed, gr.Nodes = true, p
			nodes, leaves := sets.New(p...), sets.New[string]()
			for n := range nodes {
				leaves.Insert(f.leafOf[n])
				if r.used[n] == 0 {
					gr.OpenedNodes++
				}
			}
			for l := range leaves {
				if !leafWasUsed[l] {
					gr.OpenedLeafs++
				}
			}
			gr.OneNode, gr.OneLeaf = nodes.Len() == 1, leaves.Len() == 1
		}
		r.book(g)
		r.res.Gangs = append(r.res.Gangs, gr)
	}
	for _, g := range chunk {
		whole := 0
		for _, p := range g.Pods {
			if p >= r.c.NodeGPUs {
				whole++
			}
		}
		if whole >= 2 && !slices.Contains(r.wholeRuns, whole) {
			r.wholeRuns = append(r.wholeRuns, whole)
		}
	}
}

// endOfStream records what is in use once the stream is placed: what the optimum's bounds speak of.
func (r *runner) endOfStream() {
	usedLeaves, initLeaves := sets.New[string](), sets.New[string]()
	for _, n := range r.f.nodes {
		if r.used[n] > 0 {
			r.res.UsedNodes++
			usedLeaves.Insert(r.f.leafOf[n])
		}
		if r.f.initUsed[n] > 0 {
			r.res.InitNodes++
			initLeaves.Insert(r.f.leafOf[n])
		}
	}
	r.res.UsedLeafs, r.res.InitLeafs = usedLeaves.Len(), initLeaves.Len()
}

// plain places one gang without a topology (another tenant's).
func (r *runner) plain(g gang) {
	where, seconds, _ := r.session([]gang{g}, false)
	r.res.NormalSec = append(r.res.NormalSec, seconds)
	if len(where[g.Name]) == len(g.Pods) {
		r.res.NormalOK++
	}
	for _, n := range sets.List(sets.New(where[g.Name]...)) {
		if r.used[n] == 0 {
			r.res.NormalOpen++
		}
	}
	r.book(g)
}

// runCase runs every (setting, layout) of a fabric in turns: replica i in each, then replica i+1, ...;
// then the gangs without a topology the same way.
func runCase(t *testing.T, spec Spec, c Case) []Result {
	f := newFabric(c)
	optimum := f.optimum(c.Gangs)
	var runners []*runner
	for _, s := range spec.Settings {
		for _, layout := range c.Layouts {
			r := newRunner(t, spec, c, f, layout, s)
			r.res.Optimum = optimum
			runners = append(runners, r)
		}
	}
	batch := max(c.Batch, 1)
	for first := 0; first < len(c.Gangs); first += batch {
		chunk := c.Gangs[first:min(first+batch, len(c.Gangs))]
		for _, r := range runners {
			start := time.Now()
			r.replicas(chunk)
			r.res.SessionSec += time.Since(start).Seconds()
		}
	}
	for _, r := range runners {
		r.endOfStream()
	}
	for _, g := range c.Normal {
		for _, r := range runners {
			r.plain(g)
		}
	}
	var out []Result
	for _, r := range runners {
		out = append(out, r.res)
	}
	return out
}

// placedGPUs reads the gang's pods back from the scheduler cache: node -> GPUs it took there.
func placedGPUs(sc *cache.SchedulerCache, g gang, gpusOf map[string]int) map[string]int {
	out := map[string]int{}
	sc.Mutex.Lock()
	defer sc.Mutex.Unlock()
	job := sc.Jobs[api.JobID(namespace+"/"+g.Name)]
	if job == nil {
		return out
	}
	for _, task := range job.Tasks {
		if task.NodeName != "" && task.Status != api.Pending {
			out[task.NodeName] += gpusOf[task.Name]
		}
	}
	return out
}

func TestSim(t *testing.T) {
	path := os.Getenv("SIM_SPEC")
	if path == "" {
		t.Skip("SIM_SPEC not set: run through `make bench-sim` (bench/sim.py)")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(spec.Out)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	enc := json.NewEncoder(out)
	for _, c := range spec.Cases {
		start := time.Now()
		for _, r := range runCase(t, spec, c) {
			if err := enc.Encode(r); err != nil {
				t.Fatal(err)
			}
			one := 0
			for _, g := range r.Gangs {
				if g.OneNode {
					one++
				}
			}
			t.Logf("%s %s %s: one node %d/%d (upper %d), sessions %.1fs", c.Name, r.Setting, r.Layout, one, len(r.Gangs), r.Optimum.OneNodeUpper, r.SessionSec)
		}
		t.Logf("%s: %.1fs", c.Name, time.Since(start).Seconds())
	}
}
