{{- define "aether-edge.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "aether-edge.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "aether-edge.labels" -}}
{{ include "aether-edge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: aether
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Seconds in a Go duration such as "30s" or "2m": the grace period is derived from them. */}}
{{- define "aether-edge.seconds" -}}
{{- $d := . | toString -}}
{{- if hasSuffix "ms" $d -}}1
{{- else if hasSuffix "s" $d -}}{{ trimSuffix "s" $d | int }}
{{- else if hasSuffix "m" $d -}}{{ mul (trimSuffix "m" $d | int) 60 }}
{{- else -}}{{ fail (printf "durations must end in ms, s or m: %q" $d) }}
{{- end -}}
{{- end -}}
