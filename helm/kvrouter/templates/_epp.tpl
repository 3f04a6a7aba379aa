{{/*
The endpoint picker (mode: epp): the InferencePool's name, its pods' label selector as the
router's engines.pods takes it (key=value,...), and the checks its values must pass.
*/}}
{{- define "kvrouter.epp" -}}
{{- if eq .Values.mode "epp" }}true{{- end }}
{{- end }}

{{- define "kvrouter.eppPoolName" -}}
{{- .Values.epp.inferencePool.name | default (include "kvrouter.fullname" .) }}
{{- end }}

{{- define "kvrouter.eppSelector" -}}
{{- $labels := .Values.epp.inferencePool.matchLabels }}
{{- if not $labels }}
{{- fail "epp.inferencePool.matchLabels is required in mode: epp (the labels of the model-server pods)" }}
{{- end }}
{{- $parts := list }}
{{- range $k := keys $labels | sortAlpha }}
{{- $parts = append $parts (printf "%s=%s" $k (index $labels $k)) }}
{{- end }}
{{- join "," $parts }}
{{- end }}

{{- define "kvrouter.eppChecks" -}}
{{- if include "kvrouter.epp" . }}
{{- $fixed := list (include "kvrouter.httpPort" . | int) (include "kvrouter.metricsPort" . | int) }}
{{- if has (.Values.epp.port | int) $fixed }}
{{- fail (printf "epp.port (%d) must differ from the router's API port and metrics port" (.Values.epp.port | int)) }}
{{- end }}
{{- if and .Values.gossip.enabled (eq (.Values.epp.port | int) (.Values.gossip.port | int)) }}
{{- fail "epp.port must differ from gossip.port" }}
{{- end }}
{{- end }}
{{- end }}
