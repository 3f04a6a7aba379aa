{{/*
Names, labels and the few values that several templates must agree on. Kubernetes object
names and label values are DNS labels: at most 63 characters, so every derived name is cut
before its suffix is added, never after.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "kvrouter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release-qualified name used for every object: fullnameOverride, else the release name
when it already contains the chart name, else "<release>-<chart>". Cut to 63 characters.
*/}}
{{- define "kvrouter.fullname" -}}
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

{{/* "<fullname>-<suffix>" with the full name cut so that the result stays within 63. */}}
{{- define "kvrouter.suffixed" -}}
{{- $root := index . 0 }}
{{- $suffix := index . 1 }}
{{- $room := sub 62 (len $suffix) | int }}
{{- printf "%s-%s" (include "kvrouter.fullname" $root | trunc $room | trimSuffix "-") $suffix }}
{{- end }}

{{/* Chart name and version, as the helm.sh/chart label wants them. */}}
{{- define "kvrouter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "kvrouter.labels" -}}
helm.sh/chart: {{ include "kvrouter.chart" . }}
{{ include "kvrouter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvrouter
{{- end }}

{{/* Labels that select the router pods; they never change over a release's life. */}}
{{- define "kvrouter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvrouter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/component: router
{{- end }}

{{/*
Labels of the `helm test` pod: the release's, but never the router's selector labels, so that
the Services and the Deployment do not count it as a router.
*/}}
{{- define "kvrouter.testLabels" -}}
helm.sh/chart: {{ include "kvrouter.chart" . }}
app.kubernetes.io/name: {{ include "kvrouter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/component: test
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The ServiceAccount the pods run as. */}}
{{- define "kvrouter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvrouter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the gossip secret, the admin token, the API keys and the engines' key. */}}
{{- define "kvrouter.secretName" -}}
{{- default (include "kvrouter.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{/* The headless Service through which router replicas find each other. */}}
{{- define "kvrouter.gossipServiceName" -}}
{{- include "kvrouter.suffixed" (list . "gossip") }}
{{- end }}

{{/* NAME:PORT that every replica re-resolves to find its gossip peers. */}}
{{- define "kvrouter.gossipDNS" -}}
{{- printf "%s.%s.svc.%s:%d" (include "kvrouter.gossipServiceName" .) .Release.Namespace .Values.clusterDomain (.Values.gossip.port | int) }}
{{- end }}

{{/* The container image reference. */}}
{{- define "kvrouter.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
Where the router reads its files. The config file path is the image's contract with the
chart; the policy path is where the policy ConfigMap key is mounted, and config.yaml names it.
*/}}
{{- define "kvrouter.configDir" -}}/etc/kvrouter/config{{- end }}
{{- define "kvrouter.policyDir" -}}/etc/kvrouter/policy{{- end }}
{{- define "kvrouter.gossipTLSDir" -}}/etc/kvrouter/gossip-tls{{- end }}
{{- define "kvrouter.tokenizerDir" -}}/etc/kvrouter/tokenizer{{- end }}

{{/*
The policy YAML: policy.inline when set, else the preset shipped under policies/. A preset
that the chart does not ship fails the render with the list of those it does.
*/}}
{{- define "kvrouter.policy" -}}
{{- if .Values.policy.inline }}
{{- $parsed := fromYaml .Values.policy.inline }}
{{- if hasKey $parsed "Error" }}
{{- fail (printf "policy.inline is not a YAML mapping: %s" (get $parsed "Error")) }}
{{- end }}
{{- .Values.policy.inline }}
{{- else }}
{{- $file := printf "policies/%s.yaml" .Values.policy.preset }}
{{- $text := .Files.Get $file }}
{{- if not $text }}
{{- $known := list }}
{{- range $path, $_ := .Files.Glob "policies/*.yaml" }}
{{- $known = append $known (base $path | trimSuffix ".yaml") }}
{{- end }}
{{- fail (printf "policy.preset %q: the chart has no %s; presets: %s" .Values.policy.preset $file (join ", " $known)) }}
{{- end }}
{{- $text }}
{{- end }}
{{- end }}

{{/*
The router's fixed container ports: the API (with /health and /ready), and /metrics on a port
of its own, so that the API's clients never see it.
*/}}
{{- define "kvrouter.httpPort" -}}8000{{- end }}
{{- define "kvrouter.metricsPort" -}}9090{{- end }}

{{/*
True ("true") when engines are sent an API key: secrets.engineApiKey or
router.backends.apiKeyFromSecret is set. Either way the key is "engine-api-key" of the Secret
the pods read, in the variable that config.yaml names. apiKeyFromSecret with neither an
existing Secret nor secrets.engineApiKey would leave the pods unable to start: it fails instead.
*/}}
{{- define "kvrouter.engineApiKey" -}}
{{- $v := .Values }}
{{- if and $v.router.backends.apiKeyFromSecret (not $v.secrets.existingSecret) (not $v.secrets.engineApiKey) }}
{{- fail "router.backends.apiKeyFromSecret reads engine-api-key from secrets.existingSecret, which is empty: name that Secret, or set secrets.engineApiKey instead" }}
{{- end }}
{{- if or $v.router.backends.apiKeyFromSecret $v.secrets.engineApiKey }}true{{- end }}
{{- end }}
{{- define "kvrouter.engineApiKeyEnv" -}}KVROUTER_ENGINE_API_KEY{{- end }}

{{/* True ("true") when the chart itself renders the Secret. */}}
{{- define "kvrouter.createSecret" -}}
{{- if not .Values.secrets.existingSecret }}true{{- end }}
{{- end }}
