{{- define "stormtopo.name" -}}stormtopo{{- end -}}
{{- define "stormtopo.fullname" -}}{{ .Release.Name }}-stormtopo{{- end -}}
{{- define "stormtopo.labels" -}}
app.kubernetes.io/name: stormtopo
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "stormtopo.selector" -}}
app.kubernetes.io/name: stormtopo
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "stormtopo.serviceName" -}}{{ include "stormtopo.fullname" . }}-webhook{{- end -}}
{{- define "stormtopo.tlsSecret" -}}{{ include "stormtopo.fullname" . }}-webhook-tls{{- end -}}
{{- /* Nothing publishes an image of stormtopo: the one the user built and pushed (docs/install.md, step 1). */ -}}
{{- define "stormtopo.image" -}}
{{- $repository := required "image.repository is not set: build and push stormtopo's image (docs/install.md, step 1), then --set image.repository=REGISTRY/stormtopo --set image.tag=TAG" .Values.image.repository -}}
{{ $repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- /* Where vc-scheduler's configuration is read (volcano.schedulerConfigMap): its default where the values have no
such key (an upgrade with --reuse-values keeps the older release's values, which lack it), "" where set so. */ -}}
{{- define "stormtopo.schedulerConfigMap" -}}
{{- $volcano := .Values.volcano | default dict -}}
{{- if hasKey $volcano "schedulerConfigMap" -}}{{ $volcano.schedulerConfigMap | default "" }}{{- else -}}volcano-system/volcano-scheduler-configmap{{- end -}}
{{- end -}}
