{{/* Names, labels and the values the templates share. */}}

{{- define "fairlane.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name, kept short: KubeRay appends suffixes (-raycluster-xxxxx, -head-svc) to it. */}}
{{- define "fairlane.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fairlane.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fairlane.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fairlane.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fairlane.labels" -}}
helm.sh/chart: {{ include "fairlane.chart" . }}
{{ include "fairlane.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fairlane
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "fairlane.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "fairlane.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fairlane.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* ---------- Redis ---------- */}}

{{- define "fairlane.redis.fullname" -}}
{{- printf "%s-redis" (include "fairlane.fullname" .) }}
{{- end }}

{{/* True ("true") when some Redis (built-in or external) is configured. */}}
{{- define "fairlane.redis.configured" -}}
{{- if or .Values.redis.enabled .Values.externalRedis.host }}true{{ end }}
{{- end }}

{{- define "fairlane.redis.host" -}}
{{- if .Values.redis.enabled }}
{{- printf "%s.%s.svc" (include "fairlane.redis.fullname" .) .Release.Namespace }}
{{- else }}
{{- .Values.externalRedis.host }}
{{- end }}
{{- end }}

{{- define "fairlane.redis.port" -}}
{{- if .Values.redis.enabled }}6379{{ else }}{{ .Values.externalRedis.port }}{{ end }}
{{- end }}

{{/* host:port, the form gcsFaultToleranceOptions.redisAddress takes. */}}
{{- define "fairlane.redis.address" -}}
{{- printf "%s:%s" (include "fairlane.redis.host" .) (include "fairlane.redis.port" .) }}
{{- end }}

{{/* The quota store URL: no password in it (the app reads FAIRLANE_REDIS_PASSWORD from the Secret). */}}
{{- define "fairlane.redis.url" -}}
{{- printf "redis://%s/%d" (include "fairlane.redis.address" .) (int .Values.redis.quotaDatabase) }}
{{- end }}

{{/* Secret that holds the Redis password; empty when there is none (external Redis without auth). */}}
{{- define "fairlane.redis.secretName" -}}
{{- if .Values.redis.enabled }}
{{- default (include "fairlane.redis.fullname" .) .Values.redis.auth.existingSecret }}
{{- else }}
{{- .Values.externalRedis.existingSecret }}
{{- end }}
{{- end }}

{{- define "fairlane.redis.secretKey" -}}
{{- if .Values.redis.enabled }}
{{- .Values.redis.auth.existingSecretPasswordKey }}
{{- else }}
{{- .Values.externalRedis.existingSecretPasswordKey }}
{{- end }}
{{- end }}

{{/* ---------- Tenancy ---------- */}}

{{- define "fairlane.tenancy.configMapName" -}}
{{- printf "%s-tenancy" (include "fairlane.fullname" .) }}
{{- end }}

{{- define "fairlane.tenancy.keysSecretName" -}}
{{- default (printf "%s-tenant-keys" (include "fairlane.fullname" .)) .Values.tenancy.keys.existingSecret }}
{{- end }}

{{/* Where the app reads the merged tenancy YAML (AppConfig.tenancy_config). */}}
{{- define "fairlane.tenancy.path" -}}
/etc/fairlane/tenancy/tenants.yaml
{{- end }}

{{/* The tenancy config without key hashes: the ConfigMap's tenancy.yaml. */}}
{{- define "fairlane.tenancy.public" -}}
{{- $t := omit .Values.tenancy "keys" }}
{{- toYaml $t }}
{{- end }}

{{/* ---------- serveConfigV2 ---------- */}}

{{/* AppConfig args: the values' app section plus the fields the chart owns. */}}
{{- define "fairlane.appArgs" -}}
{{- $args := deepCopy .Values.app }}
{{- /* With app.models each entry has its name: served_model_name names the one-model form only. */}}
{{- if .Values.app.models }}
{{- $args = omit $args "served_model_name" }}
{{- end }}
{{- $_ := set $args "tenancy_config" (include "fairlane.tenancy.path" .) }}
{{- $_ := set $args "host" "0.0.0.0" }}
{{- $_ := set $args "port" (int .Values.serve.port) }}
{{- if include "fairlane.redis.configured" . }}
{{- $_ := set $args "redis_url" (include "fairlane.redis.url" .) }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{- define "fairlane.serveConfig" -}}
proxy_location: {{ .Values.serve.proxyLocation }}
http_options:
  host: 0.0.0.0
  port: {{ .Values.serve.port }}
applications:
  - name: {{ .Values.serve.applicationName }}
    route_prefix: {{ .Values.serve.routePrefix }}
    import_path: cluster.app:build_app
    args:
      {{- include "fairlane.appArgs" . | nindent 6 }}
    {{- if include "fairlane.router.pinned" . }}
    {{- include "fairlane.router.deployments" . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* ---------- Checks that JSON schema cannot express ---------- */}}

{{- define "fairlane.validate" -}}
{{- $w := .Values.gpuWorkers }}
{{- if or (lt (int $w.replicas) (int $w.minReplicas)) (gt (int $w.replicas) (int $w.maxReplicas)) }}
{{- fail (printf "gpuWorkers.replicas (%d) must lie between minReplicas (%d) and maxReplicas (%d)" (int $w.replicas) (int $w.minReplicas) (int $w.maxReplicas)) }}
{{- end }}
{{- $a := .Values.app.autoscaling }}
{{- if $a }}
{{- if lt (int $a.max_replicas) (int $a.min_replicas) }}
{{- fail "app.autoscaling.max_replicas must be >= app.autoscaling.min_replicas" }}
{{- end }}
{{- if and (not (kindIs "invalid" $a.initial_replicas)) (or (lt (int $a.initial_replicas) (int $a.min_replicas)) (gt (int $a.initial_replicas) (int $a.max_replicas))) }}
{{- fail "app.autoscaling.initial_replicas must lie between min_replicas and max_replicas" }}
{{- end }}
{{- if not .Values.app.models }}
{{- $need := mulf (float64 $a.max_replicas) (float64 (default 1.0 .Values.app.replica_num_gpus)) }}
{{- $have := float64 (mul (int $w.maxReplicas) (int $w.gpusPerPod)) }}
{{- if gt $need $have }}
{{- fail (printf "app.autoscaling.max_replicas x app.replica_num_gpus needs %v GPUs but gpuWorkers.maxReplicas x gpusPerPod gives %v" $need $have) }}
{{- end }}
{{- end }}
{{- end }}
{{- include "fairlane.validateModels" . }}
{{- $r := .Values.app.router_autoscaling }}
{{- if $r }}
{{- $least := int (default 1 $r.min_routers) }}
{{- $most := int (default 4 $r.max_routers) }}
{{- if lt $most $least }}
{{- fail "app.router_autoscaling.max_routers must be >= min_routers" }}
{{- end }}
{{- if and (not (kindIs "invalid" $r.initial_routers)) (or (lt (int $r.initial_routers) $least) (gt (int $r.initial_routers) $most)) }}
{{- fail "app.router_autoscaling.initial_routers must lie between min_routers and max_routers" }}
{{- end }}
{{- end }}
{{- if and (gt (int (include "fairlane.router.most" .)) 1) (not (include "fairlane.redis.configured" .)) }}
{{- fail "app.num_routers > 1 needs Redis for shared quota state (so does router_autoscaling with max_routers > 1): set redis.enabled or externalRedis.host" }}
{{- end }}
{{- if and (include "fairlane.router.pinned" .) (hasKey (.Values.head.rayStartParams | default dict) "resources") }}
{{- fail "head.rayStartParams.resources: with app.direct_ingress (app.edge proxy) the chart sets the head's resources (the routers' fairlane_router units)" }}
{{- end }}
{{- if and .Values.gcsFaultTolerance.enabled (not (include "fairlane.redis.configured" .)) }}
{{- fail "gcsFaultTolerance.enabled needs Redis: set redis.enabled or externalRedis.host" }}
{{- end }}
{{- if and .Values.gcsFaultTolerance.enabled (not (include "fairlane.redis.secretName" .)) }}
{{- fail "gcsFaultTolerance.enabled needs a Redis password Secret: set externalRedis.existingSecret" }}
{{- end }}
{{- if not .Values.tenancy.keys.existingSecret }}
{{- if not .Values.tenancy.keys.key_salt }}
{{- fail "tenancy.keys.key_salt (or tenancy.keys.existingSecret) is required: the secret salt of the key HMACs" }}
{{- end }}
{{- if not .Values.tenancy.keys.admin_key_hash }}
{{- fail "tenancy.keys.admin_key_hash (or tenancy.keys.existingSecret) is required" }}
{{- end }}
{{- $ids := list }}
{{- range .Values.tenancy.tenants }}{{ $ids = append $ids .id }}{{ end }}
{{- $keyed := list }}
{{- range .Values.tenancy.keys.api_key_hashes }}
{{- if not (has .tenant $ids) }}
{{- fail (printf "tenancy.keys.api_key_hashes: %s is not a tenant in tenancy.tenants" .tenant) }}
{{- end }}
{{- if has .tenant $keyed }}
{{- fail (printf "tenancy.keys.api_key_hashes: tenant %s is listed twice" .tenant) }}
{{- end }}
{{- $keyed = append $keyed .tenant }}
{{- end }}
{{- range $ids }}
{{- if not (has . $keyed) }}
{{- fail (printf "tenancy.keys.api_key_hashes: tenant %s has no API key hash" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- $classes := list }}
{{- range .Values.tenancy.sla_classes }}{{ $classes = append $classes .name }}{{ end }}
{{- range .Values.tenancy.tenants }}
{{- if not (has .sla_class $classes) }}
{{- fail (printf "tenancy.tenants %s: unknown sla_class %s" .id .sla_class) }}
{{- end }}
{{- end }}
{{- end }}

{{/* app.models: unique names, each entry's autoscaling bounds, and GPUs for every model at its most
replicas (an entry without num_replicas or autoscaling takes app's, without replica_num_gpus app's). */}}
{{- define "fairlane.validateModels" -}}
{{- $app := .Values.app }}
{{- $w := .Values.gpuWorkers }}
{{- if $app.models }}
{{- $names := list }}
{{- $need := 0.0 }}
{{- range $i, $m := $app.models }}
{{- if has $m.name $names }}
{{- fail (printf "app.models.%d.name: duplicate model name %s" $i $m.name) }}
{{- end }}
{{- $names = append $names $m.name }}
{{- $scale := $app }}
{{- if or (hasKey $m "autoscaling") (hasKey $m "num_replicas") }}{{ $scale = $m }}{{ end }}
{{- $count := int (default 1 $scale.num_replicas) }}
{{- with $scale.autoscaling }}
{{- if lt (int (default 2 .max_replicas)) (int (default 1 .min_replicas)) }}
{{- fail (printf "app.models.%d.autoscaling.max_replicas must be >= min_replicas" $i) }}
{{- end }}
{{- $count = int (default 2 .max_replicas) }}
{{- end }}
{{- $gpus := $app.replica_num_gpus }}
{{- if hasKey $m "replica_num_gpus" }}{{ $gpus = $m.replica_num_gpus }}{{ end }}
{{- if kindIs "invalid" $gpus }}{{ $gpus = 1.0 }}{{ end }}
{{- $need = addf $need (mulf (float64 $count) (float64 $gpus)) }}
{{- end }}
{{- $have := float64 (mul (int $w.maxReplicas) (int $w.gpusPerPod)) }}
{{- if gt $need $have }}
{{- fail (printf "app.models at their most replicas x replica_num_gpus need %v GPUs but gpuWorkers.maxReplicas x gpusPerPod gives %v" $need $have) }}
{{- end }}
{{- end }}
{{- end }}
