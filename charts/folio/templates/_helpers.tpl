{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "folio.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "folio.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "folio.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the chart. */}}
{{- define "folio.commonLabels" -}}
helm.sh/chart: {{ include "folio.chart" . }}
app.kubernetes.io/name: {{ include "folio.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels on the operator's own objects. */}}
{{- define "folio.labels" -}}
{{ include "folio.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels selecting the operator pods. */}}
{{- define "folio.selectorLabels" -}}
app.kubernetes.io/name: {{ include "folio.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "folio.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "folio.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "folio.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The namespace the operator watches when it is not cluster-wide. */}}
{{- define "folio.watchNamespace" -}}
{{- default .Release.Namespace .Values.operator.watchNamespace }}
{{- end }}

{{/* "true" when the replicas elect an active one through kopf's peering: as asked, else when there are several. */}}
{{- define "folio.peering" -}}
{{- if kindIs "invalid" .Values.operator.peering.enabled }}
{{- if gt (int .Values.operator.replicas) 1 }}true{{ end }}
{{- else if .Values.operator.peering.enabled }}true{{ end }}
{{- end }}

{{/* Refuse values that cannot work, at render time rather than as a broken rollout. */}}
{{- define "folio.validate" -}}
{{- if and (gt (int .Values.operator.replicas) 1) (not (include "folio.peering" .)) }}
{{- fail "operator.replicas > 1 needs operator.peering (leave operator.peering.enabled empty or true): without peering every replica would reconcile at once" }}
{{- end }}
{{- if and .Values.operator.allNamespaces .Values.operator.watchNamespace }}
{{- fail "operator.watchNamespace is only used when operator.allNamespaces is false; set one or the other" }}
{{- end }}
{{- end }}
