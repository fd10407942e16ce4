{{/* Common names and labels. */}}
{{- define "dynamiccl.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "dynamiccl.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dynamiccl
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dynamiccl.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dynamiccl.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The retraining Job's image: learning.image, else the image's tag + "-train" (Dockerfile target trainer). */}}
{{- define "dynamiccl.trainImage" -}}
{{- if .Values.learning.image -}}{{ .Values.learning.image }}{{- else -}}{{ include "dynamiccl.image" . }}-train{{- end -}}
{{- end -}}

{{- define "dynamiccl.webhookService" -}}{{ include "dynamiccl.fullname" . }}-webhook{{- end -}}
{{- define "dynamiccl.ingestService" -}}{{ include "dynamiccl.fullname" . }}-ingest{{- end -}}
{{- define "dynamiccl.tlsSecret" -}}{{ include "dynamiccl.fullname" . }}-webhook-tls{{- end -}}
{{- /* The node agent's namespace: nodeAgent.namespace, else the release's. It reads the
host's /sys and /proc through hostPath volumes, which Pod Security "baseline" and
"restricted" refuse: a release namespace that enforces them needs the node agent elsewhere. */ -}}
{{- define "dynamiccl.nodeAgentNamespace" -}}{{ .Values.nodeAgent.namespace | default .Release.Namespace }}{{- end -}}
{{- define "dynamiccl.webhookConfig" -}}{{ include "dynamiccl.fullname" . }}{{- end -}}

{{- define "dynamiccl.securityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
