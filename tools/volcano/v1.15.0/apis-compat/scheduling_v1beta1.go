// Compatibility shim: Volcano v1.15.0 builds against its own staging volcano.sh/apis (released as v1.15.x),
// which the Go module proxy does not serve. v1.14.0 is served and lacks only this constant (value as in
// Volcano's design doc for the queue allocation gate). The build copies v1.14.0 and adds this file.
package v1beta1

// QueueAllocationGateKey is the pod annotation that opts a pod into Volcano's queue allocation gate.
const QueueAllocationGateKey = GroupName + "/queue-allocation-gate"
