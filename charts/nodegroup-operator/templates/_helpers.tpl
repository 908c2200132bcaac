{{- define "ngo.name" -}}nodegroup-operator{{- end -}}
{{- define "ngo.labels" -}}
app.kubernetes.io/name: {{ include "ngo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "ngo.selector" -}}
app.kubernetes.io/name: {{ include "ngo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "ngo.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- /* host:port cluster-autoscaler dials: the Service, a SAN of the serving certificate. */ -}}
{{- define "ngo.address" -}}
{{- .Values.autoscaler.cloudConfig.address | default (printf "%s.%s.svc:%v" (include "ngo.name" .) .Release.Namespace .Values.grpc.port) -}}
{{- end -}}
{{- define "ngo.cloudConfigSecret" -}}
{{- .Values.autoscaler.cloudConfig.secretName | default (printf "%s-autoscaler-cloud-config" (include "ngo.name" .)) -}}
{{- end -}}
{{- /* cluster-autoscaler's client certificate Secret: named, or the first cert-manager client. */ -}}
{{- define "ngo.clientSecret" -}}
{{- if .Values.autoscaler.clientSecretName -}}
{{- .Values.autoscaler.clientSecretName -}}
{{- else -}}
{{- $first := first .Values.grpc.certManager.clients | default (dict "name" "cluster-autoscaler") -}}
{{- printf "%s-client-%s" (include "ngo.name" .) $first.name -}}
{{- end -}}
{{- end -}}
{{- /* Label matchers of the operator's series in PromQL (the ServiceMonitor's job is the Service). */ -}}
{{- define "ngo.series" -}}
job="{{ include "ngo.name" . }}",namespace="{{ .Release.Namespace }}"
{{- end -}}
