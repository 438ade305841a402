{{/* Names and labels of the edl chart. */}}
{{- define "edl.fullname" -}}
{{- printf "%s-edl-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "edl.labels" -}}
app.kubernetes.io/name: edl-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "edl.selector" -}}
app.kubernetes.io/name: edl-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The kind of the operator's main role: cluster-wide or this namespace only. */}}
{{- define "edl.roleKind" -}}
{{- if .Values.operator.allNamespaces -}}ClusterRole{{- else -}}Role{{- end -}}
{{- end -}}
