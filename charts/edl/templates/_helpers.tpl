{{/* Names and labels of the edl chart. Names follow `helm create`'s convention: the release
     name alone when it holds the chart's name ("edl" -> edl-operator, edl-etcd), else
     release-chart ("t" -> t-edl-operator, t-edl-etcd). */}}
{{- define "edl.base" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The operator's Deployment, ServiceAccount, roles, Service and Lease. */}}
{{- define "edl.fullname" -}}
{{- printf "%s-operator" (include "edl.base" .) -}}
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

{{/* ---- etcd: in-chart (etcd.install) or the user's (etcd.endpoints) ---- */}}
{{- define "edl.etcd.name" -}}
{{- printf "%s-etcd" (include "edl.base" .) -}}
{{- end -}}

{{/* The headless Service giving each member a stable name: <member>.<peer>.<ns>.svc */}}
{{- define "edl.etcd.peerService" -}}
{{- printf "%s-peer" (include "edl.etcd.name" .) -}}
{{- end -}}

{{- define "edl.etcd.labels" -}}
app.kubernetes.io/name: edl-etcd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "edl.etcd.selector" -}}
app.kubernetes.io/name: edl-etcd
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The Secrets of the in-chart etcd, generated ones named <etcd>-<role>-tls. Either the user
     gives all three (cert-manager) or none. */}}
{{- define "edl.etcd.userSecrets" -}}
{{- $e := .Values.etcd -}}
{{- if and $e.serverSecret $e.peerSecret $e.clientSecret -}}true
{{- else if or $e.serverSecret $e.peerSecret (and $e.install $e.clientSecret) -}}
{{- fail "etcd.serverSecret, etcd.peerSecret and etcd.clientSecret come together: give all three (signed by one CA) or none, and the chart generates them" -}}
{{- end -}}
{{- end -}}

{{- define "edl.etcd.secret" -}}
{{- $root := index . 0 -}}{{- $role := index . 1 -}}
{{- $given := get $root.Values.etcd (printf "%sSecret" $role) -}}
{{- if include "edl.etcd.userSecrets" $root -}}{{ $given }}
{{- else -}}{{ printf "%s-%s-tls" (include "edl.etcd.name" $root) $role }}
{{- end -}}
{{- end -}}

{{/* What the operator and the pods connect to. */}}
{{- define "edl.etcd.endpoints" -}}
{{- if .Values.etcd.install -}}
{{- printf "https://%s.%s.svc:2379" (include "edl.etcd.name" .) .Release.Namespace -}}
{{- else -}}
{{- required "etcd.endpoints: the etcd edl uses (etcd.install is false)" .Values.etcd.endpoints -}}
{{- end -}}
{{- end -}}

{{/* The client certificate's Secret, or nothing (an external etcd without client certs). */}}
{{- define "edl.etcd.clientSecret" -}}
{{- if .Values.etcd.install -}}{{ include "edl.etcd.secret" (list . "client") }}
{{- else -}}{{ .Values.etcd.clientSecret }}
{{- end -}}
{{- end -}}
