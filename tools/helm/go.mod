// Build wrapper for helm, used to render and install the chart under deploy/helm in tests.
module stormtopo.local/tools/helm

go 1.24.0

require helm.sh/helm/v3 v3.19.0
