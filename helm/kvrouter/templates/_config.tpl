{{/*
The router's config file (the contract of `kvrouter serve --config`), as YAML. Chart values are
camelCase; the file's keys are the router's snake_case names.
*/}}
{{- define "kvrouter.config" -}}
{{- $r := .Values.router }}
{{- $kind := $r.backends.kind | default "vllm" }}
{{- $static := $r.backends.static }}
{{- if ne $kind "vllm" }}
{{- $static = list }}
{{- range $r.backends.static }}
{{- $static = append $static (dict "url" . "kind" $kind) }}
{{- end }}
{{- end }}
{{- $pools := include "kvrouter.pools" . | fromJson }}
{{- $static = concat $static $pools.static }}
{{- $backends := dict "static" $static "models_refresh_seconds" ($r.backends.modelsRefreshSeconds | int) }}
{{- $dns := list }}
{{- if $r.backends.dns.name }}
{{- $dns = list (dict "name" $r.backends.dns.name "port" ($r.backends.dns.port | int) "scheme" $r.backends.dns.scheme "interval_seconds" ($r.backends.dns.intervalSeconds | int) "kind" $kind) }}
{{- end }}
{{- /* One DNS name stays a mapping, as the router has always read it; pools make a list. */}}
{{- if $pools.dns }}
{{- $_ := set $backends "dns" (concat $dns $pools.dns) }}
{{- else if $dns }}
{{- $_ := set $backends "dns" (first $dns) }}
{{- end }}
{{- $kv := $r.backends.kvEvents }}
{{- if $kv.port }}
{{- $_ := set $backends "kv_events" (dict "port" ($kv.port | int) "replay_port" ($kv.replayPort | int) "topic" $kv.topic) }}
{{- if $kv.tokenizer.volume }}
{{- if has ".." (splitList "/" $kv.tokenizer.path) }}
{{- fail "router.backends.kvEvents.tokenizer.path must stay inside the volume (no '..')" }}
{{- end }}
{{- $_ := set $backends.kv_events "tokenizer" (trimSuffix "/" (printf "%s/%s" (include "kvrouter.tokenizerDir" .) $kv.tokenizer.path)) }}
{{- end }}
{{- else if or $kv.replayPort $kv.topic $kv.tokenizer.volume }}
{{- fail "router.backends.kvEvents.port is required when replayPort, topic or tokenizer.volume is set (0 turns KV events off)" }}
{{- end }}
{{- if include "kvrouter.epp" . }}
{{- $_ := set $backends "pods" (dict "selector" (include "kvrouter.eppSelector" .) "namespace" .Release.Namespace "port" (.Values.epp.inferencePool.targetPort | int)) }}
{{- end }}
{{- if include "kvrouter.engineApiKey" . }}
{{- $_ := set $backends "api_key_env" (include "kvrouter.engineApiKeyEnv" .) }}
{{- end }}
{{- $fixed := list (include "kvrouter.httpPort" . | int) (include "kvrouter.metricsPort" . | int) }}
{{- if and .Values.gossip.enabled (has (.Values.gossip.port | int) $fixed) }}
{{- fail (printf "gossip.port (%d) must differ from the router's API port (%d) and metrics port (%d)" (.Values.gossip.port | int) (index $fixed 0) (index $fixed 1)) }}
{{- end }}
{{- $grace := $r.drain.graceSeconds | float64 }}
{{- $killAfter := .Values.terminationGracePeriodSeconds | float64 }}
{{- if gt (addf $grace 5) $killAfter }}
{{- fail (printf "router.drain.graceSeconds (%v) + 5 is above terminationGracePeriodSeconds (%v): the router cuts what is left of its streams when its grace ends, and the kubelet's SIGKILL must come at least 5 seconds after that" $grace $killAfter) }}
{{- end }}
{{- $tls := dict "cert_file" "" "key_file" "" "ca_file" "" }}
{{- if .Values.gossip.tls.enabled }}
{{- $dir := include "kvrouter.gossipTLSDir" . }}
{{- $tls = dict "cert_file" (printf "%s/tls.crt" $dir) "key_file" (printf "%s/tls.key" $dir) "ca_file" (printf "%s/ca.crt" $dir) }}
{{- end }}
{{- $config := dict
  "listen" (dict "host" "0.0.0.0" "port" (include "kvrouter.httpPort" . | int) "metrics_port" (include "kvrouter.metricsPort" . | int))
  "policy" (printf "%s/policy.yaml" (include "kvrouter.policyDir" .))
  "policy_reload" (dict "enabled" .Values.policy.reload.enabled "interval_seconds" (.Values.policy.reload.intervalSeconds | int))
  "backends" $backends
  "health" (dict
    "path" $r.health.path
    "interval_seconds" ($r.health.intervalSeconds | int)
    "timeout_seconds" ($r.health.timeoutSeconds | int)
    "eject_after_failures" ($r.health.ejectAfterFailures | int)
    "readmit_backoff_seconds" ($r.health.readmitBackoffSeconds | int)
    "readmit_backoff_max_seconds" ($r.health.readmitBackoffMaxSeconds | int))
  "timeouts" (dict
    "connect_seconds" ($r.timeouts.connectSeconds | int)
    "first_byte_seconds" ($r.timeouts.firstByteSeconds | int)
    "idle_stream_seconds" ($r.timeouts.idleStreamSeconds | int))
  "limits" (dict
    "max_body_bytes" ($r.limits.maxBodyBytes | int)
    "max_attempts" ($r.limits.maxAttempts | int)
    "retry_budget_percent" ($r.limits.retryBudgetPercent | float64)
    "max_connections" ($r.limits.maxConnections | int)
    "header_timeout_seconds" ($r.limits.headerTimeoutSeconds | float64)
    "keepalive_timeout_seconds" ($r.limits.keepaliveTimeoutSeconds | float64))
  "flow_control" (dict
    "enabled" $r.flowControl.enabled
    "max_queue" ($r.flowControl.maxQueue | int)
    "max_wait_seconds" ($r.flowControl.maxWaitSeconds | float64)
    "max_inflight_per_engine" ($r.flowControl.maxInflightPerEngine | int)
    "priority_reserve" ($r.flowControl.priorityReserve | int)
    "tenant_header" $r.flowControl.tenantHeader
    "priority_header" $r.flowControl.priorityHeader)
  "forwarding" (dict
    "client_credentials" $r.forwarding.clientCredentials
    "trust_forwarding_headers" $r.forwarding.trustForwardingHeaders)
  "drain" (dict "grace_seconds" $grace)
  "tracing" (dict
    "enabled" $r.tracing.enabled
    "endpoint" $r.tracing.endpoint
    "protocol" $r.tracing.protocol
    "sample_ratio" ($r.tracing.sampleRatio | float64)
    "service_name" $r.tracing.serviceName)
  "access_log" (dict
    "enabled" $r.accessLog.enabled
    "sample" ($r.accessLog.sample | float64))
  "route_headers" $r.routeHeaders
  "admin_token_env" "KVROUTER_ADMIN_TOKEN"
  "gossip" (dict
    "enabled" .Values.gossip.enabled
    "port" (.Values.gossip.port | int)
    "dns" (include "kvrouter.gossipDNS" .)
    "peers" .Values.gossip.peers
    "secret_env" "KVROUTER_GOSSIP_SECRET"
    "tls" $tls)
}}
{{- with $pools.disaggregation }}
{{- $_ := set $config "disaggregation" . }}
{{- end }}
{{- if include "kvrouter.epp" . }}
{{- $_ := set $config "epp" (dict "port" (.Values.epp.port | int) "proxy" .Values.epp.proxy) }}
{{- end }}
{{- toYaml $config }}
{{- end }}


{{/*
The config file's models section: applied live by the router's config watcher, so it stays out
of the config checksum that restarts the pods (unless policy.reload is off).
*/}}
{{- define "kvrouter.models" -}}
{{- $m := .Values.router.models }}
{{- toYaml (dict "models" (dict "aliases" ($m.aliases | default dict) "patterns" ($m.patterns | default list))) }}
{{- end }}
