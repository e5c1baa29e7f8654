{{/*
`sluice rollout` in the chart: its settings file and its Job, each checked
once here so the ConfigMap, the Job and NOTES read the same answer.

"sluice.rolloutSettings" returns the settings as `sluice rollout start
--config FILE` reads them (sluice.rollout.settings: camelCase keys, a null
gate is off). rollout.quality.skip becomes quality.enabled false; the
device is a flag of the Job, not a setting. An empty rollout.prometheusUrl
leaves prometheus.url out, so the code's default applies.
*/}}
{{- define "sluice.rolloutSettings" -}}
{{- $r := .Values.rollout }}
{{- $plan := $r.plan }}
{{- $previous := 0 }}
{{- range $plan.steps }}
{{- if le (int .) $previous }}
{{- fail (printf "rollout.plan.steps must increase, got %v" $plan.steps) }}
{{- end }}
{{- $previous = int . }}
{{- end }}
{{- if ne $previous 100 }}
{{- fail (printf "rollout.plan.steps must end at 100 (the cut), got %v" $plan.steps) }}
{{- end }}
{{- $maxStep := index $plan "maxStepSeconds" }}
{{- if and (not (kindIs "invalid" $maxStep)) (lt (float64 $maxStep) (float64 $plan.dwellSeconds)) }}
{{- fail (printf "rollout.plan.maxStepSeconds (%v) must be at least dwellSeconds (%v), or null" $maxStep $plan.dwellSeconds) }}
{{- end }}
{{- $slo := dict }}
{{- range $key := list "maxTtftP99Seconds" "maxItlP99Seconds" "maxErrorRate" "maxTtftP99Ratio" "maxItlP99Ratio" "maxErrorRateIncrease" "relativeSlackSeconds" }}
{{- /* A gate set to null in a values file may be dropped by Helm; index reads a missing key as nil: off. */ -}}
{{- $_ := set $slo $key (index $r.slo $key) }}
{{- end }}
{{- $prometheus := dict "class" $r.slo.class "minWindowSeconds" $r.slo.minWindowSeconds }}
{{- with $r.prometheusUrl }}
{{- $_ := set $prometheus "url" . }}
{{- end }}
{{- $quality := dict "enabled" (not $r.quality.skip) "minGreedyAgreement" $r.quality.minGreedyAgreement "maxLogprobDrop" $r.quality.maxLogprobDrop "maxCheckRegressions" $r.quality.maxCheckRegressions }}
{{- $settings := dict "steps" $plan.steps "dwellSeconds" $plan.dwellSeconds "minRequests" $plan.minRequests "maxStepSeconds" $maxStep "pollSeconds" $plan.pollSeconds "slo" $slo "quality" $quality "prometheus" $prometheus }}
{{- toJson $settings }}
{{- end }}

{{/*
The rollout Job's checked inputs, as YAML (read back with fromYaml):
  candidate  the candidate's merged modelVersions entry
  versions   every version of the alias (the Job mounts each one's weights:
             the serving version is chosen from the live catalog)
  deadline   activeDeadlineSeconds
  gpus       1 when the quality check runs on cuda, else 0
Fails, naming the value to fix, when the Job could not do its work.
*/}}
{{- define "sluice.rolloutJob" -}}
{{- $r := .Values.rollout }}
{{- $job := $r.job }}
{{- range $key := list "alias" "candidate" }}
{{- if not (get $job $key) }}
{{- fail (printf "rollout.job.%s must be set when rollout.job.enabled is true" $key) }}
{{- end }}
{{- end }}
{{- if not $r.prometheusUrl }}
{{- fail "rollout.prometheusUrl must be set when rollout.job.enabled is true: the SLO gates read the gateways' metrics from it" }}
{{- end }}
{{- if not $r.rbac.enabled }}
{{- fail "rollout.job needs rollout.rbac.enabled: the Job runs as the <release>-rollout ServiceAccount" }}
{{- end }}
{{- $all := (include "sluice.modelVersions" . | fromYaml).versions }}
{{- $versions := list }}
{{- $names := list }}
{{- $aliases := list }}
{{- $candidate := dict }}
{{- $total := 0 }}
{{- range $all }}
{{- $aliases = append $aliases .alias }}
{{- if eq .alias $job.alias }}
{{- $versions = append $versions . }}
{{- $names = append $names .version }}
{{- $total = add $total (int .weight) }}
{{- if eq .version $job.candidate }}
{{- $candidate = . }}
{{- end }}
{{- end }}
{{- end }}
{{- if not $versions }}
{{- fail (printf "rollout.job.alias %q is not an alias in modelVersions (they have: %s)" $job.alias (join ", " ($aliases | uniq))) }}
{{- end }}
{{- if not $candidate }}
{{- fail (printf "rollout.job.candidate %q is not a version of alias %q in modelVersions (it has: %s)" $job.candidate $job.alias (join ", " $names)) }}
{{- end }}
{{- if lt (len $versions) 2 }}
{{- fail (printf "rollout.job: alias %q has no version besides %q to roll out from (a finished rollout: set rollout.job.enabled false)" $job.alias $job.candidate) }}
{{- end }}
{{- if $job.serving }}
{{- if or (eq $job.serving $job.candidate) (not (has $job.serving $names)) }}
{{- fail (printf "rollout.job.serving %q must be another version of alias %q (it has: %s)" $job.serving $job.alias (join ", " $names)) }}
{{- end }}
{{- end }}
{{- /* Each helm upgrade runs the hook again: once the values give the candidate everything, it is done. */ -}}
{{- if eq (int $candidate.weight) (int $total) }}
{{- fail (printf "rollout.job: %q already has all of alias %q's weight in modelVersions; the rollout is done: set rollout.job.enabled false (or name the next candidate)" $job.candidate $job.alias) }}
{{- end }}
{{- $deadline := int $job.activeDeadlineSeconds }}
{{- if eq $deadline 0 }}
{{- $plan := $r.plan }}
{{- $step := maxf (float64 $plan.dwellSeconds) (float64 (index $plan "maxStepSeconds" | default 0)) }}
{{- $deadline = int (ceil (addf (float64 $job.qualityCheckSeconds) (mulf (float64 $job.deadlineFactor) (float64 (len $plan.steps)) $step))) }}
{{- end }}
{{- if lt $deadline 1 }}
{{- fail "rollout.job: the computed deadline is 0 s (dwellSeconds and qualityCheckSeconds are 0): set rollout.job.activeDeadlineSeconds" }}
{{- end }}
{{- $gpus := ternary 1 0 (and (not $r.quality.skip) (hasPrefix "cuda" $r.quality.device)) }}
{{- toYaml (dict "candidate" $candidate "versions" $versions "deadline" $deadline "gpus" $gpus) }}
{{- end }}
