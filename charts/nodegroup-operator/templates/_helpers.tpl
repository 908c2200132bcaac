{{- define "ngo.name" -}}nodegroup-operator{{- end -}}
{{- define "ngo.labels" -}}
app.kubernetes.io/name: {{ include "ngo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}
{{- define "ngo.selector" -}}
app.kubernetes.io/name: {{ include "ngo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
