{{/*
Shared logic. Role-specific helpers take a dict:
  (dict "root" $ "role" "router")                        gateway | router | scheduler | replica
  (dict "root" $ "role" "replica" "version" $version)    $version = one merged modelVersions entry
*/}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.fullname" -}}
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

{{/* DNS-safe suffix of a model version: its `name`, else the version slugged. */}}
{{- define "sluice.versionSlug" -}}
{{- $v := .version }}
{{- default ($v.version | lower | replace "." "-" | replace "_" "-") $v.name | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/* Object name of a role: <fullname>-<role>[-<version slug>]. */}}
{{- define "sluice.componentName" -}}
{{- $base := printf "%s-%s" (include "sluice.fullname" .root) .role }}
{{- if .version }}
{{- printf "%s-%s" $base (include "sluice.versionSlug" .) | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $base | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels that select a role's pods (and one version's replica pods). */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- if .version }}
sluice.dev/model-version: {{ .version.version | quote }}
{{- end }}
{{- end }}

{{/* Every object's labels: selector labels plus bookkeeping. */}}
{{- define "sluice.labels" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/part-of: sluice
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- if .version }}
sluice.dev/model-alias: {{ .version.alias | quote }}
{{- end }}
{{- end }}

{{/* Image reference of a role: replicas get the CUDA image, the rest the control-plane image. */}}
{{- define "sluice.image" -}}
{{- $image := ternary .root.Values.images.replica .root.Values.images.controlPlane (eq .role "replica") }}
image: {{ printf "%s:%s" $image.repository $image.tag | quote }}
imagePullPolicy: {{ $image.pullPolicy }}
{{- end }}

{{/* Host:port of a role's Service, as other pods in the namespace dial it. */}}
{{- define "sluice.address" -}}
{{- $port := .port }}
{{- if not $port }}
{{- $port = (index .root.Values .role).port }}
{{- end }}
{{- printf "%s:%d" (include "sluice.componentName" .) (int $port) }}
{{- end }}

{{/* SIGTERM -> NOT_SERVING -> stop(grace): the kubelet must wait longer than the grace. */}}
{{- define "sluice.terminationGracePeriodSeconds" -}}
{{- add (int .root.Values.shutdown.graceSeconds) (int .root.Values.shutdown.marginSeconds) }}
{{- end }}

{{/* Environment every service reads (sluice.config.SluiceSettings). */}}
{{- define "sluice.commonEnv" -}}
- name: SLUICE_LOG_LEVEL
  value: {{ .root.Values.logLevel | quote }}
- name: SLUICE_LOG_FORMAT
  value: {{ .root.Values.logFormat | quote }}
- name: SLUICE_SHUTDOWN_GRACE_S
  value: {{ int .root.Values.shutdown.graceSeconds | quote }}
# /metrics on its own port in every service (the gateway's public port then
# serves none).
- name: SLUICE_METRICS_HOST
  value: "0.0.0.0"
- name: SLUICE_METRICS_PORT
  value: {{ int .root.Values.metrics.port | quote }}
{{- end }}

{{/*
Pod-level settings shared by every role. A role that calls the Kubernetes
API passes "serviceAccount" (its ServiceAccount's name); the others get no
token at all.
*/}}
{{- define "sluice.podSpecCommon" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .serviceAccount }}
serviceAccountName: {{ .serviceAccount }}
automountServiceAccountToken: true
{{- else }}
# This service never calls the Kubernetes API.
automountServiceAccountToken: false
{{- end }}
terminationGracePeriodSeconds: {{ include "sluice.terminationGracePeriodSeconds" . }}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  seccompProfile:
    type: RuntimeDefault
{{- with .scheduling.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .scheduling.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .scheduling.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Container security context: the root filesystem is read-only, /tmp is an emptyDir. */}}
{{- define "sluice.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end }}

{{/*
Native Kubernetes gRPC probes against grpc.health.v1 (service "", which every
Sluice server reports). Takes (dict "port" N "probes" {startup?, readiness, liveness}).
*/}}
{{- define "sluice.grpcProbes" -}}
{{- $port := int .port }}
{{- with .probes.startup }}
startupProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: {{ int .periodSeconds }}
  failureThreshold: {{ int .failureThreshold }}
  timeoutSeconds: 5
{{- end }}
readinessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: {{ int .probes.readiness.periodSeconds }}
  failureThreshold: {{ int .probes.readiness.failureThreshold }}
  timeoutSeconds: 5
livenessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: {{ int .probes.liveness.periodSeconds }}
  failureThreshold: {{ int .probes.liveness.failureThreshold }}
  timeoutSeconds: 5
{{- end }}

{{/* A PodDisruptionBudget for a role (and version); takes the role dict plus "pdb". */}}
{{- define "sluice.pdb" -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "sluice.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ int .pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "sluice.selectorLabels" . | nindent 6 }}
{{- end }}

{{/* NetworkPolicy peer that may scrape metrics ports. */}}
{{- define "sluice.metricsPeer" -}}
{{- $from := .root.Values.networkPolicy.metricsFrom }}
- namespaceSelector:
    {{- toYaml $from.namespaceSelector | nindent 4 }}
  {{- with $from.podSelector }}
  podSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* NetworkPolicy peer: the pods of another role in this release. */}}
{{- define "sluice.rolePeer" -}}
- podSelector:
    matchLabels:
      {{- include "sluice.selectorLabels" . | nindent 6 }}
{{- end }}

{{/*
The merged settings of each model version: replicaDefaults overridden by the
modelVersions entry. Returns YAML {versions: [...]}; read it back with fromYaml.
*/}}
{{- define "sluice.modelVersions" -}}
{{- $versions := list }}
{{- $seen := dict }}
{{- $aliasWeights := dict }}
{{- range .Values.modelVersions }}
{{- $slug := include "sluice.versionSlug" (dict "version" .) }}
{{- if hasKey $seen $slug }}
{{- fail (printf "modelVersions: %q and %q map to the same object names (%s); give one a `name`" (get $seen $slug) .version $slug) }}
{{- end }}
{{- $_ := set $seen $slug .version }}
{{- $_ := set $aliasWeights .alias (add (get $aliasWeights .alias | default 0) (int .weight)) }}
{{- $versions = append $versions (mergeOverwrite (deepCopy $.Values.replicaDefaults) (deepCopy .)) }}
{{- end }}
{{- range $alias, $total := $aliasWeights }}
{{- if eq (int $total) 0 }}
{{- fail (printf "modelVersions: every version of alias %q has weight 0" $alias) }}
{{- end }}
{{- end }}
{{- toYaml (dict "versions" $versions) }}
{{- end }}

{{/* Where a version's checkpoint sits inside router and replica pods. */}}
{{- define "sluice.modelDir" -}}
{{- if .version.volume }}
{{- printf "/model-versions/%s/%s" (include "sluice.versionSlug" .) (.version.modelPath | trimPrefix "/") | trimSuffix "/" }}
{{- else }}
{{- printf "%s/%s" (.root.Values.modelStore.mountPath | trimSuffix "/") (.version.modelPath | trimPrefix "/") | trimSuffix "/" }}
{{- end }}
{{- end }}

{{/* Name of the volume holding a version's checkpoint. */}}
{{- define "sluice.modelVolumeName" -}}
{{- if .version.volume }}
{{- printf "model-%s" (include "sluice.versionSlug" .) | trunc 63 | trimSuffix "-" }}
{{- else -}}
models
{{- end }}
{{- end }}

{{/*
The rule groups of files/prometheus-rules.yaml (generated from
deploy/observability/rules.py), each runbook_url prefixed with
observability.runbookBaseUrl. The PrometheusRule and the plain rules file
both render this, so the two cannot differ.
*/}}
{{- define "sluice.prometheusRuleGroups" -}}
{{- $rules := .Files.Get "files/prometheus-rules.yaml" | fromYaml }}
{{- $base := .Values.observability.runbookBaseUrl }}
{{- range $rules.groups }}
{{- range .rules }}
{{- with .annotations }}
{{- if .runbook_url }}
{{- $_ := set . "runbook_url" (printf "%s%s" $base .runbook_url) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $rules.groups }}
{{- end }}
