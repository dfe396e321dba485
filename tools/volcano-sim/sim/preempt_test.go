package sim

// The preemption benchmark of `python -m bench preemption` (bench/preemption.py writes the spec and reads the
// results): Volcano v1.15.1's own actions, in the order the scheduler conf the dev cluster ships names them
// (stormtopo/devenv/cluster.py: enqueue, allocate, preempt, gangpreempt, backfill), on a cluster full of
// running lower-priority jobs, until one high-priority gang with a network topology is placed or gives up.
//
// Nothing is mocked but the API server, as in TestSim: Volcano's scheduler cache, sessions, actions and
// plugins. gangpreempt evicts through the cache (Evict marks the pod Releasing and calls the evictor); between
// sessions the pods the cache holds as Releasing are deleted from it, as their kubelet would end them, and
// recorded as the victims. Binds go to a recording binder and stay in the cache, as in TestSim.
//
// The victims' PodGroups are Running with their minMember; their pods and PodGroups carry a PriorityClass
// (the cache reads a job's priority from its PodGroup's class, gangpreempt and the priority plugin compare
// those). The preemptor's PodGroup is created Inqueue (as TestSim's replicas; gangpreempt skips Pending jobs,
// and enqueue would admit it: the queue has no capability), hard or soft, with its highestTierAllowed.

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/record"

	schedulingv1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
	topologyv1alpha1 "volcano.sh/apis/pkg/apis/topology/v1alpha1"
	vcscheduler "volcano.sh/volcano/pkg/scheduler"
	"volcano.sh/volcano/pkg/scheduler/api"
	"volcano.sh/volcano/pkg/scheduler/cache"
	"volcano.sh/volcano/pkg/scheduler/conf"
	"volcano.sh/volcano/pkg/scheduler/framework"
	"volcano.sh/volcano/pkg/scheduler/util"
)

// PreemptSpec is what bench/preemption.py asks for (JSON in $PREEMPT_SPEC).
type PreemptSpec struct {
	SchedulerConf string        `json:"scheduler_conf"`
	Cases         []PreemptCase `json:"cases"`
	Out           string        `json:"out"`
}

type PreemptLeaf struct {
	Name  string   `json:"name"`
	Spine string   `json:"spine"`
	Nodes []string `json:"nodes"`
}

type PreemptPod struct {
	Node string `json:"node"`
	GPUs int    `json:"gpus"`
}

type PreemptJob struct {
	Name      string       `json:"name"`
	Priority  int32        `json:"priority"`
	MinMember int32        `json:"min_member"`
	Pods      []PreemptPod `json:"pods"`
}

type PreemptGang struct {
	Name     string `json:"name"`
	Priority int32  `json:"priority"`
	Pods     []int  `json:"pods"` // GPUs per pod
	Mode     string `json:"mode"` // hard or soft
	Tier     int    `json:"tier"` // highestTierAllowed
}

type PreemptCase struct {
	Name     string        `json:"name"`
	NodeGPUs int           `json:"node_gpus"`
	Leaves   []PreemptLeaf `json:"leaves"`
	Jobs     []PreemptJob  `json:"jobs"`
	Gang     PreemptGang   `json:"gang"`
	Sessions int           `json:"sessions"`
	// Pods already evicted when the gang arrives (stormtopo's victims: it evicts them, then lets the gang go):
	// they start Releasing, as a pod being deleted, and are recorded as victims of session 0.
	Evicted []string `json:"evicted,omitempty"`
}

type Victim struct {
	Job      string `json:"job"`
	Pod      string `json:"pod"`
	Node     string `json:"node"`
	GPUs     int    `json:"gpus"`
	Priority int32  `json:"priority"`
	Session  int    `json:"session"`
}

type PreemptSession struct {
	Evicted   int      `json:"evicted"`
	Pipelined []string `json:"pipelined,omitempty"` // nodes the gang's pods were pipelined to (gangpreempt's nomination)
	Bound     []string `json:"bound,omitempty"`
	Seconds   float64  `json:"seconds"`
}

type PreemptResult struct {
	Case     string           `json:"case"`
	Victims  []Victim         `json:"victims"`
	Placed   bool             `json:"placed"`
	Nodes    []string         `json:"nodes,omitempty"` // where the gang's pods were bound, one per pod
	Sessions []PreemptSession `json:"sessions"`
	SetupSec float64          `json:"setup_s"`
}

func priorityClassName(p int32) string { return fmt.Sprintf("p-%d", p) }

// preemptHyperNodes: tier 1 = the leaves, tier 2 = the spines (Volcano's session adds its own top above them).
func preemptHyperNodes(c PreemptCase) *api.HyperNodesInfo {
	s := &layoutState{hns: map[string]*api.HyperNodeInfo{}, byTier: map[int]sets.Set[string]{}, real: map[string]sets.Set[string]{}}
	spineMembers := map[string][]api.MemberConfig{}
	spineNodes := map[string]sets.Set[string]{}
	var spines []string
	for _, leaf := range c.Leaves {
		var members []api.MemberConfig
		for _, n := range leaf.Nodes {
			members = append(members, member(n, topologyv1alpha1.MemberTypeNode))
		}
		s.add(leaf.Name, 1, members, sets.New(leaf.Nodes...))
		if spineNodes[leaf.Spine] == nil {
			spineNodes[leaf.Spine] = sets.New[string]()
			spines = append(spines, leaf.Spine)
		}
		spineMembers[leaf.Spine] = append(spineMembers[leaf.Spine], member(leaf.Name, topologyv1alpha1.MemberTypeHyperNode))
		spineNodes[leaf.Spine].Insert(leaf.Nodes...)
	}
	for _, spine := range spines {
		s.add(spine, 2, spineMembers[spine], spineNodes[spine])
	}
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
	return api.NewHyperNodesInfoWithCache(s.hns, s.byTier, s.real, ready)
}

func withPriority(p *v1.Pod, priority int32) *v1.Pod {
	p.Spec.PriorityClassName = priorityClassName(priority)
	p.Spec.Priority = &priority
	return p
}

func newPreemptCache(c PreemptCase, stop chan struct{}) *cache.SchedulerCache {
	sc := cache.NewCustomMockSchedulerCache("preempt", &recordingBinder{}, util.NewFakeEvictor(0), &util.FakeStatusUpdater{}, nil, &record.FakeRecorder{})
	sc.Run(stop)
	sc.WaitForCacheSync(stop)
	alloc := api.BuildResourceList(fmt.Sprint(nodeCPU), fmt.Sprintf("%dGi", nodeMemGiB),
		api.ScalarResource{Name: "nvidia.com/gpu", Value: fmt.Sprint(c.NodeGPUs)}, api.ScalarResource{Name: "pods", Value: "110"})
	for _, leaf := range c.Leaves {
		for _, n := range leaf.Nodes {
			sc.AddOrUpdateNode(util.BuildNode(n, alloc, map[string]string{"kubernetes.io/hostname": n}))
		}
	}
	sc.AddQueueV1beta1(util.BuildQueue(queueName, 1, nil))
	priorities := sets.New(c.Gang.Priority)
	for _, j := range c.Jobs {
		priorities.Insert(j.Priority)
	}
	for _, p := range sets.List(priorities) {
		sc.AddPriorityClass(&schedv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: priorityClassName(p)}, Value: p})
	}
	evicted := sets.New(c.Evicted...)
	for _, j := range c.Jobs {
		pg := util.BuildPodGroup(j.Name, namespace, queueName, j.MinMember, nil, schedulingv1.PodGroupRunning)
		pg.Spec.PriorityClassName = priorityClassName(j.Priority)
		sc.AddPodGroupV1beta1(pg)
		for i, p := range j.Pods {
			pod := util.BuildPod(namespace, fmt.Sprintf("%s-%d", j.Name, i), p.Node, v1.PodRunning, resources(p.GPUs, "1"), j.Name, nil, nil)
			pod.CreationTimestamp = metav1.NewTime(time.Unix(int64(i), 0))
			if evicted.Has(pod.Name) {
				gone := metav1.NewTime(time.Unix(1000, 0))
				pod.DeletionTimestamp = &gone
			}
			sc.AddPod(withPriority(pod, j.Priority))
		}
	}
	g := c.Gang
	pg := util.BuildPodGroupWithNetWorkTopologies(g.Name, namespace, "", queueName, int32(len(g.Pods)), nil, schedulingv1.PodGroupInqueue, g.Mode, g.Tier)
	pg.Spec.PriorityClassName = priorityClassName(g.Priority)
	sc.AddPodGroupV1beta1(pg)
	for i, p := range podsOf(gang{Name: g.Name, Pods: g.Pods}) {
		p.CreationTimestamp = metav1.NewTime(time.Unix(int64(i), 0))
		sc.AddPod(withPriority(p, g.Priority))
	}
	sc.HyperNodesInfo = preemptHyperNodes(c)
	return sc
}

// runPreemptCase runs sessions of the conf's actions until the gang is bound or the sessions run out.
func runPreemptCase(t *testing.T, spec PreemptSpec, c PreemptCase) PreemptResult {
	actions, tiers, configs, _, err := vcscheduler.UnmarshalSchedulerConf(spec.SchedulerConf)
	if err != nil {
		t.Fatalf("scheduler conf: %v", err)
	}
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	sc := newPreemptCache(c, stop)
	res := PreemptResult{Case: c.Name, SetupSec: time.Since(start).Seconds()}
	jobOf := map[api.JobID]PreemptJob{}
	for _, j := range c.Jobs {
		jobOf[api.JobID(namespace+"/"+j.Name)] = j
	}
	gangID := api.JobID(namespace + "/" + c.Gang.Name)
	for session := 1; session <= max(c.Sessions, 1); session++ {
		conf.EnabledActionMap = map[string]bool{}
		for _, a := range actions {
			conf.EnabledActionMap[a.Name()] = true
		}
		began := time.Now()
		ssn := framework.OpenSession(sc, tiers, configs)
		for _, a := range actions {
			a.Initialize()
			a.Execute(ssn)
			a.UnInitialize()
		}
		var step PreemptSession
		if job := ssn.Jobs[gangID]; job != nil {
			for _, task := range job.TaskStatusIndex[api.Pipelined] {
				step.Pipelined = append(step.Pipelined, task.NodeName)
			}
		}
		framework.CloseSession(ssn)
		step.Seconds = time.Since(began).Seconds()

		// The pods the cache holds as Releasing were evicted: record them and end them.
		var gone []*v1.Pod
		sc.Mutex.Lock()
		for id, job := range sc.Jobs {
			for _, task := range job.Tasks {
				if task.Status != api.Releasing {
					continue
				}
				j := jobOf[id]
				gpus := 0
				for i, p := range j.Pods {
					if fmt.Sprintf("%s-%d", j.Name, i) == task.Name {
						gpus = p.GPUs
					}
				}
				when := session
				if slices.Contains(c.Evicted, task.Name) {
					when = 0
				}
				res.Victims = append(res.Victims, Victim{Job: j.Name, Pod: task.Name, Node: task.NodeName, GPUs: gpus, Priority: j.Priority, Session: when})
				gone = append(gone, task.Pod)
			}
			if id == gangID {
				for _, task := range job.Tasks {
					if task.NodeName != "" && (task.Status == api.Binding || task.Status == api.Bound || task.Status == api.Allocated || task.Status == api.Running) {
						step.Bound = append(step.Bound, task.NodeName)
					}
				}
			}
		}
		sc.Mutex.Unlock()
		for _, p := range gone {
			sc.DeletePod(p)
		}
		step.Evicted = len(gone)
		sort.Strings(step.Pipelined)
		sort.Strings(step.Bound)
		res.Sessions = append(res.Sessions, step)
		if len(step.Bound) == len(c.Gang.Pods) {
			res.Placed, res.Nodes = true, step.Bound
			break
		}
	}
	sort.Slice(res.Victims, func(i, j int) bool { return res.Victims[i].Pod < res.Victims[j].Pod })
	return res
}

func TestPreempt(t *testing.T) {
	path := os.Getenv("PREEMPT_SPEC")
	if path == "" {
		t.Skip("PREEMPT_SPEC not set: run through `python -m bench preemption` (bench/preemption.py)")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec PreemptSpec
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
		r := runPreemptCase(t, spec, c)
		if err := enc.Encode(r); err != nil {
			t.Fatal(err)
		}
		gpus := 0
		for _, v := range r.Victims {
			gpus += v.GPUs
		}
		t.Logf("%s: %d victims (%d GPUs), placed %t after %d sessions, %.1fs", c.Name, len(r.Victims), gpus, r.Placed, len(r.Sessions), time.Since(start).Seconds())
	}
}
