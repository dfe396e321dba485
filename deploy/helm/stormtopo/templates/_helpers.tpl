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
