{{/*
The prefill and decode pools (router.backends.prefill, router.backends.decode) and
router.disaggregation, as the config file's pieces, in JSON for kvrouter.config:
{"static": [...], "dns": [...], "disaggregation": {...} or absent}. A pool's engines are
listed by URL, found under a DNS name, or under a headless Service's name in the release's
namespace; each carries its role, and under SGLang's protocol the prefill pool's bootstrap
port. Empty pools give empty lists and no disaggregation section.
*/}}
{{- define "kvrouter.pools" -}}
{{- $b := .Values.router.backends }}
{{- $d := .Values.router.disaggregation }}
{{- $kind := $b.kind | default "vllm" }}
{{- $static := list }}
{{- $dns := list }}
{{- range $role := list "prefill" "decode" }}
{{- $pool := index $b $role }}
{{- $extra := dict }}
{{- if ne $kind "vllm" }}
{{- $_ := set $extra "kind" $kind }}
{{- end }}
{{- if and (eq $role "prefill") $pool.bootstrapPort }}
{{- $_ := set $extra "bootstrap_port" ($pool.bootstrapPort | int) }}
{{- end }}
{{- range $pool.static }}
{{- $static = append $static (merge (dict "url" . "role" $role) $extra) }}
{{- end }}
{{- if and $pool.dnsName $pool.service }}
{{- fail (printf "router.backends.%s: give dnsName or service, not both" $role) }}
{{- end }}
{{- $name := $pool.dnsName }}
{{- if $pool.service }}
{{- $name = printf "%s.%s.svc.%s" $pool.service $.Release.Namespace $.Values.clusterDomain }}
{{- end }}
{{- if $name }}
{{- $dns = append $dns (merge (dict "name" $name "port" ($pool.port | int) "scheme" $b.dns.scheme "interval_seconds" ($b.dns.intervalSeconds | int) "role" $role) $extra) }}
{{- end }}
{{- end }}
{{- $out := dict "static" $static "dns" $dns }}
{{- if or $static $dns }}
{{- if include "kvrouter.epp" . }}
{{- fail "router.backends.prefill and router.backends.decode are for mode: proxy; in mode: epp the InferencePool's pods are the engines" }}
{{- end }}
{{- $section := dict "protocol" $d.protocol "link_gbps" ($d.linkGbps | float64) "prefill_tokens_per_s" ($d.prefillTokensPerS | float64) "decider" $d.decider "threshold_tokens" ($d.thresholdTokens | int) }}
{{- $m := $d.model }}
{{- $shape := list ($m.layers | int) ($m.kvHeads | int) ($m.headDim | int) }}
{{- if and $d.kvBytesPerToken (or (index $shape 0) (index $shape 1) (index $shape 2)) }}
{{- fail "router.disaggregation: give kvBytesPerToken or the model's shape (model), not both" }}
{{- else if $d.kvBytesPerToken }}
{{- $_ := set $section "kv_bytes_per_token" ($d.kvBytesPerToken | int) }}
{{- else if and (index $shape 0) (index $shape 1) (index $shape 2) }}
{{- $_ := set $section "model" (dict "layers" (index $shape 0) "kv_heads" (index $shape 1) "head_dim" (index $shape 2) "bytes_per_value" ($m.bytesPerValue | int)) }}
{{- else if or (index $shape 0) (index $shape 1) (index $shape 2) }}
{{- fail (printf "router.disaggregation.model needs layers, kvHeads and headDim together (got %d, %d, %d)" (index $shape 0) (index $shape 1) (index $shape 2)) }}
{{- end }}
{{- $_ := set $out "disaggregation" $section }}
{{- end }}
{{- toJson $out }}
{{- end }}
