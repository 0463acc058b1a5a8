{{/* Name of the release's objects: "<release>-ringseed", or the release name if it contains "ringseed". */}}
{{- define "ringseed.fullname" -}}
{{- if contains "ringseed" .Release.Name -}}
{{- .Release.Name | trunc 54 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-ringseed" .Release.Name | trunc 54 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ringseed.labels" -}}
app.kubernetes.io/name: ringseed
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "ringseed.operatorSelectorLabels" -}}
app.kubernetes.io/name: ringseed
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "ringseed.image" -}}
{{- /* toString: `--set image.tag=1` makes the tag a number (`--set-string` keeps "1.10" as written). */ -}}
{{- printf "%s:%s" .Values.image.repository (toString (default .Chart.AppVersion .Values.image.tag)) -}}
{{- end -}}

{{- define "ringseed.operatorServiceAccountName" -}}
{{- default (printf "%s-operator" (include "ringseed.fullname" .)) .Values.operator.serviceAccount.name -}}
{{- end -}}
