{{- /* The application's name: the app.kubernetes.io/name label (nameOverride replaces it). */ -}}
{{- define "ngo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- /*
The base of every object name, cluster-scoped ones included. Without an override it is the
chart's name, whatever the release is called: releases installed before the overrides existed
keep their objects' names on upgrade. A second release in the cluster sets fullnameOverride (the
base itself) or nameOverride (<release>-<nameOverride>, or the release name when it contains
nameOverride: the usual Helm `fullname` rule).
*/ -}}
{{- define "ngo.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if .Values.nameOverride -}}
{{- if contains .Values.nameOverride .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- else -}}
{{- .Chart.Name -}}
{{- end -}}
{{- end -}}
{{- define "ngo.labels" -}}
app.kubernetes.io/name: {{ include "ngo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- /*
Labels and annotations of the RBAC objects: the release that owns them, which the release guard
(release-guard.yaml) keeps any other release from taking over where lookup cannot see it
(helm template, Argo CD).
*/ -}}
{{- define "ngo.guardedMetadata" -}}
labels:
  {{- include "ngo.labels" . | nindent 2 }}
  nodegroup.dev/release-guard: "true"
annotations:
  nodegroup.dev/release: {{ printf "%s/%s" .Release.Namespace .Release.Name | quote }}
{{- end -}}
{{- define "ngo.selector" -}}
app.kubernetes.io/name: {{ include "ngo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- /* repository@digest with image.digest, else repository:tag (default: the appVersion). */ -}}
{{- define "ngo.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}
{{- /* The leader Lease: one per release, so two releases in one namespace each have a leader. */ -}}
{{- define "ngo.lease" -}}
{{- .Values.leaderElection.leaseName | default (include "ngo.fullname" .) -}}
{{- end -}}
{{- /*
Security contexts: the restricted profile, with podSecurityContext / securityContext merged
over it (a key set there wins; the rest of the profile stays). Used by the operator's pod and
the `helm test` pod.
*/ -}}
{{- define "ngo.podSecurityContext" -}}
{{- if .Values.podSecurityContext -}}
{{- toYaml (mergeOverwrite (dict "runAsNonRoot" true "seccompProfile" (dict "type" "RuntimeDefault")) (deepCopy .Values.podSecurityContext)) -}}
{{- else -}}
runAsNonRoot: true
seccompProfile: {type: RuntimeDefault}
{{- end -}}
{{- end -}}
{{- define "ngo.securityContext" -}}
{{- if .Values.securityContext -}}
{{- toYaml (mergeOverwrite (dict "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "capabilities" (dict "drop" (list "ALL"))) (deepCopy .Values.securityContext)) -}}
{{- else -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}
{{- end -}}
{{- /*
Refuses to render an object another release owns: (list $ apiVersion kind namespace name).
Helm would refuse too, in terms of ownership metadata; this says which release has the name and
how to give this one its own. lookup only answers against a cluster (install, upgrade,
--dry-run=server): `helm template` renders without the check.
*/ -}}
{{- define "ngo.claim" -}}
{{- $root := index . 0 }}
{{- $found := lookup (index . 1) (index . 2) (index . 3) (index . 4) }}
{{- $release := dig "metadata" "annotations" "meta.helm.sh/release-name" "" $found }}
{{- $releaseNamespace := dig "metadata" "annotations" "meta.helm.sh/release-namespace" "" $found }}
{{- if and $release (or (ne $release $root.Release.Name) (ne $releaseNamespace $root.Release.Namespace)) }}
{{- $where := ternary "" (printf " in namespace %s" (index . 3)) (eq (index . 3) "") }}
{{- fail (printf "%s %s%s belongs to release %s (namespace %s): give release %s names of its own with fullnameOverride (e.g. --set fullnameOverride=%s-nodegroup-operator) or nameOverride" (index . 2) (index . 4) $where $release $releaseNamespace $root.Release.Name $root.Release.Name) }}
{{- end }}
{{- end -}}
{{- /* host:port cluster-autoscaler dials: the Service, a SAN of the serving certificate. */ -}}
{{- define "ngo.address" -}}
{{- .Values.autoscaler.cloudConfig.address | default (printf "%s.%s.svc:%v" (include "ngo.fullname" .) .Release.Namespace .Values.grpc.port) -}}
{{- end -}}
{{- define "ngo.cloudConfigSecret" -}}
{{- .Values.autoscaler.cloudConfig.secretName | default (printf "%s-autoscaler-cloud-config" (include "ngo.fullname" .)) -}}
{{- end -}}
{{- /* cluster-autoscaler's client certificate Secret: named, or the first cert-manager client. */ -}}
{{- define "ngo.clientSecret" -}}
{{- if .Values.autoscaler.clientSecretName -}}
{{- .Values.autoscaler.clientSecretName -}}
{{- else -}}
{{- $first := first .Values.grpc.certManager.clients | default (dict "name" "cluster-autoscaler") -}}
{{- printf "%s-client-%s" (include "ngo.fullname" .) $first.name -}}
{{- end -}}
{{- end -}}
{{- /*
PromQL label matchers of the operator's series: metrics.prometheusRule.selector, or the
ServiceMonitor's (prometheus-operator labels a Service's targets job=<Service name>,
namespace=<its namespace>). validate.yaml refuses the rule with neither.
*/ -}}
{{- define "ngo.series" -}}
{{- if .Values.metrics.prometheusRule.selector -}}
{{- .Values.metrics.prometheusRule.selector -}}
{{- else -}}
job="{{ include "ngo.fullname" . }}",namespace="{{ .Release.Namespace }}"
{{- end -}}
{{- end -}}
{{- /*
The replica count: `replicas`, or `replicaCount` (the cluster-autoscaler chart's name for it),
which wins when set.
*/ -}}
{{- define "ngo.replicas" -}}
{{- if kindIs "invalid" .Values.replicaCount -}}
{{- .Values.replicas -}}
{{- else -}}
{{- .Values.replicaCount -}}
{{- end -}}
{{- end -}}
{{- /*
The pod's priority class. `auto`: system-cluster-critical in kube-system, where Kubernetes
always admits it (as the cluster-autoscaler chart does), so the provider of the autoscaler is
not evicted for the pods it lets the autoscaler place; none elsewhere, where a ResourceQuota
may limit system classes to kube-system (GKE's does). "" means none.
*/ -}}
{{- define "ngo.priorityClassName" -}}
{{- if eq .Values.priorityClassName "auto" -}}
{{- if eq .Release.Namespace "kube-system" -}}system-cluster-critical{{- end -}}
{{- else -}}
{{- .Values.priorityClassName -}}
{{- end -}}
{{- end -}}
