"""The words stormtopo shares with AIBrix, Volcano and its users: API groups, labels, annotations.

Written once here; every other module names them from this one.
"""

from __future__ import annotations

# API groups and versions, as (group, version).
AIBRIX = ("orchestration.aibrix.ai", "v1alpha1")
VOLCANO_SCHEDULING = ("scheduling.volcano.sh", "v1beta1")
VOLCANO_TOPOLOGY = ("topology.volcano.sh", "v1alpha1")
PODGROUP_API = "/".join(VOLCANO_SCHEDULING)
HYPERNODE_API = "/".join(VOLCANO_TOPOLOGY)
STORMSERVICE_API = "/".join(AIBRIX)
PODGROUP_CRD = "podgroups.scheduling.volcano.sh"

# Labels AIBrix sets on RoleSets, their pods and its PodGroups.
STORMSERVICE_LABEL = "storm-service-name"
ROLESET_LABEL = "roleset-name"
REVISION_LABEL = "storm-service-revision"  # AIBrix: the StormService revision a RoleSet was made from
ROLE_LABEL = "role-name"
HOSTNAME_LABEL = "kubernetes.io/hostname"  # set by the kubelet on every node

# Volcano's pod annotations: the gang a pod joins, and its task (role) within the gang.
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
TASK_SPEC_ANNOTATION = "volcano.sh/task-spec"
VOLCANO_SCHEDULER = "volcano"
DEFAULT_SCHEDULERS = (None, "", "default-scheduler")  # a pod template that names no scheduler of its own

# The request, on the StormService. Volcano's keys where Volcano has a word for the thing.
MODE = "volcano.sh/network-topology-mode"
HIGHEST_TIER = "volcano.sh/network-topology-highest-tier"
HIGHEST_TIER_NAME = "volcano.sh/network-topology-highest-tier-name"
SCOPE = "stormtopo.io/topology-scope"
REPLICA_HIGHEST_TIER = "stormtopo.io/replica-highest-tier"
REPLICA_HIGHEST_TIER_NAME = "stormtopo.io/replica-highest-tier-name"
# With a request: the replicas go to different HyperNodes of this tier while one holds the whole replica (core/spread.py).
REPLICA_SPREAD_TIER = "stormtopo.io/replica-spread-tier"
REPLICA_SPREAD_TIER_NAME = "stormtopo.io/replica-spread-tier-name"
PREFER_SAME_NODE = "stormtopo.io/prefer-same-node"  # "true": a replica's pods prefer one node where they fit
REQUEST_ANNOTATIONS = (MODE, HIGHEST_TIER, HIGHEST_TIER_NAME, SCOPE, REPLICA_HIGHEST_TIER, REPLICA_HIGHEST_TIER_NAME)

# What stormtopo writes.
REQUEST_ANNOTATION = "stormtopo.io/request"  # on PodGroups: the request they carry, for humans and `explain`
PLACEMENT_ANNOTATION = "stormtopo.io/placement"  # on the StormService: where each replica landed
HEAL_ANNOTATION = "stormtopo.io/heal"  # on the StormService: "true" moves a replica wider than its request into one domain
# On the StormService: "true" (with stormtopo.io/heal: "true") lets --heal-make-room move one of its replicas, within its
# tier, so that another service's wide replica fits; never below max(1, replicas - 1) ready replicas; never with one replica.
LEND_ROOM_ANNOTATION = "stormtopo.io/lend-room"
# On a soft replica's PodGroup while it preempts: held hard within a tier for a while (core/narrowing.py).
NARROWED_ANNOTATION = "stormtopo.io/narrowed"
MOVES_ANNOTATION = "stormtopo.io/moves"  # on the StormService: each replica's last move (the cool-down survives restarts)
DOMAIN_LABEL_PREFIX = "stormtopo.io/hypernode-tier-"  # on bound pods: the HyperNode of each tier
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
OPERATOR_NAME = "stormtopo"
MANAGED_BY = {MANAGED_BY_LABEL: OPERATOR_NAME}
# Volcano's HyperNode discovery (label, UFM) labels what it discovers; it rewrites those and deletes every
# HyperNode with this label that it did not discover.
TOPOLOGY_SOURCE_LABEL = "volcano.sh/network-topology-source"
NODE_TIER_LABEL = "stormtopo.io/node-tier"  # "true" on the tier-0 HyperNodes the operator's --node-tier renders and may delete

GPU = "nvidia.com/gpu"  # the resource that decides where an inference replica fits

# Only opted-in StormServices depend on stormtopo: the webhooks fail open, and an in-process
# admission policy refuses a pod of a listed StormService that stormtopo has not admitted.
ADMITTED_LABEL = "stormtopo.io/admitted"  # on pods stormtopo admitted into their replica's gang (value "true")
OPTED_IN_CONFIGMAP = "stormtopo-opted-in"  # data: "<namespace>.<stormservice>" -> scope
# On every role template of a StormService created with a request (the mutating webhook adds it), so on every
# pod of it: the admission policy holds such a pod until stormtopo admitted it, with no list to write first.
OPTED_IN_LABEL = "stormtopo.io/opted-in"
# Scheduling gate on a pod that asks for no resources, until its replica is placed; with a spread tier, on
# every pod of a replica, until stormtopo lets it go with its siblings' domains kept out (core/spread.py).
DOMAIN_GATE = "stormtopo.io/domain"
# Scheduling gate on every pod of a replica that preempts (exact preemption, core/preempting.py): held until
# the fewest victims are on their way out, then let go (not pinned: Volcano places it, on their room as it
# pipelines onto it), so that Volcano's gangpreempt finds it no longer starving and picks no victims of its own.
ROOM_GATE = "stormtopo.io/room"
STORMTOPO_GATES = (DOMAIN_GATE, ROOM_GATE)
# On a pod let go from that gate with its siblings' spread domains kept out: only such pods may be held
# again (deleted while unbound, core/spread.py; the chart's policy delete-unbound-only reads it).
SPREAD_KEPT_OUT_LABEL = "stormtopo.io/spread-kept-out"
