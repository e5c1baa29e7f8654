{{/*
The gateway's backends and data volume, checked once: every template that
needs them includes "sluice.gateway" and reads the YAML it returns, so a
values set that would silently misbehave fails the render with a message
instead (values.yaml, "backends").

  multiple         more than one gateway pod (replicas > 1 or autoscaling)
  maxPods          the most gateway pods there can be
  persistentClaim  name of the data volume's claim ("" = emptyDir)
  createClaim      the chart creates that claim
*/}}
{{- define "sluice.gateway" -}}
{{- $v := .Values }}
{{- $g := $v.gateway }}
{{- $auto := $g.autoscaling }}
{{- $maxPods := ternary (int $auto.maxReplicas) (int $g.replicas) $auto.enabled }}
{{- $multiple := or $auto.enabled (gt (int $g.replicas) 1) }}
{{- $pods := ternary (printf "gateway.autoscaling (up to %d pods)" $maxPods) (printf "gateway.replicas=%d" (int $g.replicas)) $auto.enabled }}
{{- if and $auto.enabled (lt (int $auto.maxReplicas) (int $auto.minReplicas)) }}
{{- fail (printf "gateway.autoscaling: maxReplicas %d is below minReplicas %d" (int $auto.maxReplicas) (int $auto.minReplicas)) }}
{{- end }}
{{- if $multiple }}
{{- if ne $v.backends.database "external" }}
{{- fail (printf "%s needs backends.database=external (a Postgres URL in the Secret's %s): with SQLite every gateway pod would keep its own usage ledger and API keys" $pods $v.secrets.databaseUrlKey) }}
{{- end }}
{{- if ne $v.backends.limits "redis" }}
{{- fail (printf "%s needs backends.limits=redis (REDIS_URL in the Secret's %s): with in-process limits every tenant would get %d times its rate and concurrency limits" $pods $v.secrets.redisUrlKey $maxPods) }}
{{- end }}
{{- end }}
{{- if and (or (eq $v.backends.database "external") (eq $v.backends.limits "redis")) (not $v.secrets.existingSecret) }}
{{- fail "backends.database=external and backends.limits=redis read their URLs from a Secret: set secrets.existingSecret to its name" }}
{{- end }}
{{- $storage := $g.storage }}
{{- $claim := "" }}
{{- $create := false }}
{{- if eq $storage.type "persistentVolumeClaim" }}
{{- if $multiple }}
{{- fail (printf "%s with gateway.storage.type=persistentVolumeClaim: one ReadWriteOnce claim holds one gateway's outbox; with an external database use gateway.storage.type=emptyDir (the outbox then only holds rows the database has not taken yet)" $pods) }}
{{- end }}
{{- $claim = $storage.persistentVolumeClaim.existingClaim }}
{{- if not $claim }}
{{- $claim = include "sluice.componentName" (dict "root" . "role" "gateway-data") }}
{{- $create = true }}
{{- end }}
{{- else if and (eq $v.backends.database "sqlite") (not $storage.allowEphemeralLedger) }}
{{- fail "gateway.storage.type=emptyDir with backends.database=sqlite would lose the usage ledger and API keys with the pod: use a persistentVolumeClaim, an external database, or set gateway.storage.allowEphemeralLedger=true for a throwaway install" }}
{{- end }}
{{- toYaml (dict "multiple" $multiple "maxPods" $maxPods "persistentClaim" $claim "createClaim" $create) }}
{{- end }}
