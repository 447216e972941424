{{/* The labels of every object of the chart. */}}
{{- define "example-operator.labels" -}}
app.kubernetes.io/name: example-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The labels that select the operator's Pods. */}}
{{- define "example-operator.selector" -}}
app.kubernetes.io/name: example-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
