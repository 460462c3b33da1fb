{{/* labels NAME: the labels deploy/kubernetes gives each object, and Helm's. */}}
{{- define "gpupass.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: gpupass
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* image VALUES: repository@digest, else repository:tag. */}}
{{- define "gpupass.image" -}}
{{- if .digest -}}
{{ .repository }}@{{ .digest }}
{{- else -}}
{{ .repository }}:{{ .tag }}
{{- end -}}
{{- end -}}

{{/* clusterName: the agent's ClusterRole and binding, gpupass-agent-nodes
as in deploy/kubernetes in namespace gpupass, else with the namespace. */}}
{{- define "gpupass.clusterName" -}}
{{- if eq .Release.Namespace "gpupass" -}}
gpupass-agent-nodes
{{- else -}}
gpupass-agent-nodes-{{ .Release.Namespace }}
{{- end -}}
{{- end -}}
