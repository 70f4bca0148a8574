{{/* Serve's direct ingress beside its proxy (app.edge proxy, app.direct_ingress): each router serves HTTP on
a port of the head pod.

Serve 2.60 gives a node's routers the lowest free ports from 30000 (RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT),
one each. The chart makes those ports known in advance: the routers are pinned to the head pod by a custom
Ray resource with one unit per router (so a replacement router starts only once the one it replaces has
stopped, and takes its port back: the pods set RAY_SERVE_PORT_QUARANTINE_S=0, Serve's hold on a freed port
being for HAProxy, which fairlane does not run). Router n listens on 30000 + n. */}}

{{- define "fairlane.router.firstPort" -}}30000{{- end }}

{{/* The routers' deployment name: ROUTER_DEPLOYMENT in cluster/edge/ingress.py. */}}
{{- define "fairlane.router.deployment" -}}Router{{- end }}

{{/* The most routers that may run: num_routers, or router_autoscaling's max_routers (its default 4). */}}
{{- define "fairlane.router.most" -}}
{{- if .Values.app.router_autoscaling }}{{ int (default 4 .Values.app.router_autoscaling.max_routers) }}{{ else }}{{ int .Values.app.num_routers }}{{ end }}
{{- end }}

{{/* The custom Ray resource of the head pod that the routers ask for, one unit each. */}}
{{- define "fairlane.router.resource" -}}fairlane_router{{- end }}

{{/* The routers pinned to the head on known ports: direct ingress beside Serve's proxy (app.edge proxy).
With app.edge haproxy (the default) HAProxy finds every router's port itself, wherever it runs. */}}
{{- define "fairlane.router.pinned" -}}
{{- if and .Values.app.direct_ingress (eq (include "fairlane.edge" .) "proxy") }}true{{ end }}
{{- end }}

{{- define "fairlane.edge" -}}{{ default "haproxy" .Values.app.edge }}{{- end }}

{{/* Read by every Ray process when it starts (Serve's controller, each router, HAProxy's manager):
cluster/ops/edge.py edge_env, with Serve's own side ports (a pod holds one cluster). */}}
{{- define "fairlane.router.env" -}}
{{- $haproxy := eq (include "fairlane.edge" .) "haproxy" }}
- name: RAY_SERVE_ENABLE_HA_PROXY
  value: {{ ternary "1" "0" $haproxy | quote }}
- name: RAY_SERVE_ENABLE_DIRECT_INGRESS
  value: {{ ternary "1" "0" (or $haproxy (eq .Values.app.direct_ingress true)) | quote }}
{{- if or $haproxy .Values.app.direct_ingress }}
- name: RAY_SERVE_PORT_QUARANTINE_S
  value: "0"
{{- end }}
{{- if $haproxy }}
- name: RAY_SERVE_HAPROXY_RETRY_ON
  value: "conn-failure empty-response"
- name: RAY_SERVE_HAPROXY_RETRIES
  value: "3"
- name: RAY_SERVE_HAPROXY_TUNE_BUFSIZE
  value: "65536"
{{- end }}
{{- end }}

{{/* The head's ray start resources: KubeRay's quoted-JSON form of --resources. */}}
{{- define "fairlane.router.headResources" -}}
{{ printf "\"{\\\"%s\\\": %d}\"" (include "fairlane.router.resource" .) (int (include "fairlane.router.most" .)) | squote }}
{{- end }}

{{/* The head container's router ports, router-0 ... router-(most routers - 1). */}}
{{- define "fairlane.router.containerPorts" -}}
{{- $first := int (include "fairlane.router.firstPort" .) }}
{{- range $i := until (int (include "fairlane.router.most" .)) }}
- name: router-{{ $i }}
  containerPort: {{ add $first $i }}
{{- end }}
{{- end }}

{{/* serveConfigV2's override of the router deployment: on the head pod, still no CPU reserved. It replaces
the code's ray_actor_options whole, so it repeats their runtime env (cluster/app.py router_actor_options). */}}
{{- define "fairlane.router.deployments" -}}
deployments:
  - name: {{ include "fairlane.router.deployment" . }}
    ray_actor_options:
      num_cpus: 0
      resources:
        {{ include "fairlane.router.resource" . }}: 1
{{- if ne .Values.app.router_on_serve_loop false }}
      runtime_env:
        env_vars:
          RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD: "0"
{{- end }}
{{- end }}
