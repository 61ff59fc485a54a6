{{/* Chart name. */}}
{{- define "disagg.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release fullname, used for every object the chart creates. */}}
{{- define "disagg.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "disagg.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "disagg.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: disagg
{{- end -}}

{{- define "disagg.selectorLabels" -}}
app.kubernetes.io/name: {{ include "disagg.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "disagg.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "disagg.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository[:tag][@digest] */}}
{{- define "disagg.imageRef" -}}
{{- $ref := printf "%s:%s" .repository .tag -}}
{{- if .digest -}}{{- $ref = printf "%s@%s" $ref .digest -}}{{- end -}}
{{- $ref -}}
{{- end -}}

{{- define "disagg.image" -}}
{{- include "disagg.imageRef" (dict "repository" .Values.image.repository "tag" (default .Chart.AppVersion .Values.image.tag) "digest" .Values.image.digest) -}}
{{- end -}}

{{- define "disagg.routerImage" -}}
{{- $r := .Values.router.image -}}
{{- $repo := default .Values.image.repository $r.repository -}}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) $r.tag -}}
{{- $digest := $r.digest -}}
{{- if and (not $r.repository) (not $r.tag) (not $digest) -}}{{- $digest = .Values.image.digest -}}{{- end -}}
{{- include "disagg.imageRef" (dict "repository" $repo "tag" $tag "digest" $digest) -}}
{{- end -}}

{{/* Namespaces watched with scope "namespace" (a list; the release namespace by default). */}}
{{- define "disagg.watchNamespaces" -}}
{{- if .Values.watch.namespaces -}}
{{- toJson .Values.watch.namespaces -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{- define "disagg.clusterScoped" -}}
{{- if eq .Values.watch.scope "cluster" -}}true{{- end -}}
{{- end -}}

{{- define "disagg.peeringName" -}}
{{- default (include "disagg.fullname" .) .Values.peering.name -}}
{{- end -}}

{{/* Labels for Prometheus Operator objects. */}}
{{- define "disagg.monitoringLabels" -}}
{{ include "disagg.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Relabelings shared by the router and worker PodMonitors: the label contract for PromQL (see
docs/observability.md): namespace, pod, model (DisaggregatedModel name), role (prefill|decode|aggregated|router). */}}
{{- define "disagg.podRelabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_label_serving_disagg_dev_model]
  targetLabel: model
- sourceLabels: [__meta_kubernetes_pod_label_serving_disagg_dev_role]
  targetLabel: role
- sourceLabels: [__meta_kubernetes_pod_label_serving_disagg_dev_compat_hash]
  targetLabel: compat_hash
{{- end -}}

{{- define "disagg.podMonitorNamespaceSelector" -}}
{{- if .Values.monitoring.podMonitors.namespaces }}
namespaceSelector:
  matchNames: {{ toJson .Values.monitoring.podMonitors.namespaces }}
{{- else if include "disagg.clusterScoped" . }}
namespaceSelector:
  any: true
{{- else }}
namespaceSelector:
  matchNames: {{ include "disagg.watchNamespaces" . }}
{{- end }}
{{- end -}}

{{/* RBAC rules that apply in every watched namespace (templates/rbac.yaml). */}}
{{- define "disagg.rules" -}}
# The API: DisaggregatedModels, their status, kopf's finalizers/annotations (patch).
- apiGroups: [serving.disagg.dev]
  resources: [disaggregatedmodels]
  verbs: [get, list, watch, patch, update]
- apiGroups: [serving.disagg.dev]
  resources: [disaggregatedmodels/status]
  verbs: [get, patch, update]
# Children carry an ownerReference with blockOwnerDeletion: clusters with the OwnerReferencesPermissionEnforcement
# admission plugin require `update` on the owner's finalizers for that.
- apiGroups: [serving.disagg.dev]
  resources: [disaggregatedmodels/finalizers]
  verbs: [update]
# What the operator creates and owns for each model.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, update, patch, delete]
# Multi-node pools (docs/multinode.md): StatefulSet groups, or a LeaderWorkerSet per pool when its CRD is installed.
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, update, patch, delete]
# A multi-node group whose member failed starts over: the operator deletes every pod of it (StatefulSet back end).
# Before a scale-down the autoscaler patches each pool pod's controller.kubernetes.io/pod-deletion-cost (its
# in-flight requests), so the ReplicaSet removes the idlest pods first.
- apiGroups: [""]
  resources: [pods]
  verbs: [delete, patch]
# The autoscaler sets pool sizes through the scale subresource (field manager disagg-autoscaler), as HPA does.
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [get, patch]
# The namespace's pod-security.kubernetes.io/enforce label: a pool whose Pod Security level it refuses gets a
# PodSecurity condition and a Warning (a Role in a namespace grants `get` on that namespace object itself).
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get]
- apiGroups: [""]
  resources: [services, configmaps, serviceaccounts]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, update, patch, delete]
# Read-only: pool readiness, and what the routers' Role grants (the operator must hold it to grant it).
- apiGroups: [""]
  resources: [pods, endpoints]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
{{- if .Values.rbac.readSecrets }}
# spec.autoscaling.prometheus.authSecretRef: one named Secret, read on demand (no list/watch).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
# Events about models (kopf posts core/v1 events; events.k8s.io for newer clients).
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* Secret names of an imagePullSecrets list ([{name: a}, {name: b}]), comma-separated: "a,b". */}}
{{- define "disagg.secretNames" -}}
{{- $names := list -}}
{{- range . }}{{- $names = append $names .name -}}{{- end -}}
{{- join "," $names -}}
{{- end -}}
