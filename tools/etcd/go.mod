// Build wrapper for etcd: the server module replaces its sibling modules by path, so pin them here.
module stormtopo.local/tools/etcd

go 1.26.0

require (
	go.etcd.io/etcd/api/v3 v3.6.16
	go.etcd.io/etcd/client/pkg/v3 v3.6.16
	go.etcd.io/etcd/client/v3 v3.6.16
	go.etcd.io/etcd/pkg/v3 v3.6.16
	go.etcd.io/etcd/server/v3 v3.6.16
)
