{{/*
The router's config file (the contract of `kvrouter serve --config`), as YAML. Chart values are
camelCase; the file's keys are the router's snake_case names.
*/}}
{{- define "kvrouter.config" -}}
{{- $r := .Values.router }}
{{- $backends := dict "static" $r.backends.static "models_refresh_seconds" ($r.backends.modelsRefreshSeconds | int) }}
{{- if $r.backends.dns.name }}
{{- $_ := set $backends "dns" (dict "name" $r.backends.dns.name "port" ($r.backends.dns.port | int) "scheme" $r.backends.dns.scheme "interval_seconds" ($r.backends.dns.intervalSeconds | int)) }}
{{- end }}
{{- $kv := $r.backends.kvEvents }}
{{- if $kv.port }}
{{- $_ := set $backends "kv_events" (dict "port" ($kv.port | int) "replay_port" ($kv.replayPort | int) "topic" $kv.topic) }}
{{- else if or $kv.replayPort $kv.topic }}
{{- fail "router.backends.kvEvents.port is required when replayPort or topic is set (0 turns KV events off)" }}
{{- end }}
{{- $tls := dict "cert_file" "" "key_file" "" "ca_file" "" }}
{{- if .Values.gossip.tls.enabled }}
{{- $dir := include "kvrouter.gossipTLSDir" . }}
{{- $tls = dict "cert_file" (printf "%s/tls.crt" $dir) "key_file" (printf "%s/tls.key" $dir) "ca_file" (printf "%s/ca.crt" $dir) }}
{{- end }}
{{- $config := dict
  "listen" (dict "host" "0.0.0.0" "port" 8000)
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
  "limits" (dict "max_body_bytes" ($r.limits.maxBodyBytes | int) "max_attempts" ($r.limits.maxAttempts | int))
  "admin_token_env" "KVROUTER_ADMIN_TOKEN"
  "gossip" (dict
    "enabled" .Values.gossip.enabled
    "port" (.Values.gossip.port | int)
    "dns" (include "kvrouter.gossipDNS" .)
    "peers" .Values.gossip.peers
    "secret_env" "KVROUTER_GOSSIP_SECRET"
    "tls" $tls)
}}
{{- toYaml $config }}
{{- end }}
