{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "rlmon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name. */}}
{{- define "rlmon.fullname" -}}
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

{{- define "rlmon.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rlmon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rlmon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rlmon.labels" -}}
helm.sh/chart: {{ include "rlmon.chart" . }}
{{ include "rlmon.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rlmon
{{- end }}

{{/* Labels of the objects kube-prometheus-stack selects: ours plus `release:`. */}}
{{- define "rlmon.monitoringLabels" -}}
{{ include "rlmon.labels" . }}
{{- with .Values.kubePrometheusStack.release }}
release: {{ . | quote }}
{{- end }}
{{- end }}

{{- define "rlmon.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rlmon.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The head's GCS address: ray.headAddress, else the KubeRay head service's GCS port. */}}
{{- define "rlmon.rayAddress" -}}
{{- if .Values.ray.headAddress }}
{{- .Values.ray.headAddress }}
{{- else }}
{{- $k := .Values.ray.kuberay }}
{{- $svc := $k.headService | default (printf "%s-head-svc" (required "set ray.headAddress or ray.kuberay.clusterName" $k.clusterName)) }}
{{- printf "%s.%s.svc.cluster.local:%d" $svc ($k.namespace | default .Release.Namespace) (int $k.gcsPort) }}
{{- end }}
{{- end }}

{{/* The container's script: join the RayCluster as a node offering the service resource, then
run `rlmon serve` against that local node (exec: it gets SIGTERM and shuts down gracefully). */}}
{{- define "rlmon.serveScript" -}}
{{- $res := printf "{\"%s\": 1}" .Values.ray.serviceResource -}}
ray start --address={{ include "rlmon.rayAddress" . }} --num-cpus=0 --num-gpus=0 --resources={{ $res | squote }} --object-store-memory={{ int64 .Values.ray.objectStoreMemory }} --disable-usage-stats && exec rlmon serve --address auto --service-resource {{ .Values.ray.serviceResource }} --port {{ .Values.port }} --host 0.0.0.0 --config /etc/rlmon/config.yaml --state-dir /var/lib/rlmon
{{- end }}

{{- define "rlmon.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
