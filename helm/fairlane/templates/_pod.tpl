{{/* Pieces shared by the head and the GPU worker pod templates. */}}

{{- define "fairlane.ray.env" -}}
{{- /* Read by Serve's proxy when it starts: it calls the routers over gRPC (app.proxy_grpc). */}}
- name: RAY_SERVE_PROXY_USE_GRPC
  value: {{ ternary "1" "0" (ne .Values.app.proxy_grpc false) | quote }}
{{ include "fairlane.router.env" . }}
{{- if include "fairlane.redis.secretName" . }}
- name: FAIRLANE_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "fairlane.redis.secretName" . }}
      key: {{ include "fairlane.redis.secretKey" . }}
{{- end }}
{{- if include "fairlane.ledger.secretName" . }}
{{- /* The ledger's DSN (password inside): read by the routers, never written into the RayService. */}}
- name: FAIRLANE_LEDGER_DSN
  valueFrom:
    secretKeyRef:
      name: {{ include "fairlane.ledger.secretName" . }}
      key: {{ include "fairlane.ledger.secretKey" . }}
{{- end }}
{{- if .Values.ray.readOnlyRootFilesystem }}
- name: XDG_CACHE_HOME
  value: {{ .Values.ray.cacheDir | quote }}
{{- end }}
{{- with .Values.ray.env }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "fairlane.ray.securityContext" -}}
{{- $sc := deepCopy .Values.ray.securityContext }}
{{- $_ := set $sc "readOnlyRootFilesystem" .Values.ray.readOnlyRootFilesystem }}
{{- toYaml $sc }}
{{- end }}

{{- define "fairlane.ray.volumeMounts" -}}
- name: tenancy
  mountPath: /etc/fairlane/tenancy
  readOnly: true
- name: dshm
  mountPath: /dev/shm
{{- if .Values.ray.readOnlyRootFilesystem }}
- name: tmp
  mountPath: /tmp
- name: cache
  mountPath: {{ .Values.ray.cacheDir }}
{{- end }}
{{- if .Values.app.ledger }}
- name: ledger-spill
  mountPath: {{ .Values.app.ledger_spill_dir }}
{{- end }}
{{- end }}

{{- define "fairlane.ray.volumes" -}}
- name: tenancy-src
  configMap:
    name: {{ include "fairlane.tenancy.configMapName" . }}
- name: tenancy-keys
  secret:
    secretName: {{ include "fairlane.tenancy.keysSecretName" . }}
    defaultMode: 288
    items:
      - key: keys.yaml
        path: keys.yaml
- name: tenancy
  emptyDir:
    medium: Memory
    sizeLimit: 4Mi
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.ray.shmSize }}
{{- if .Values.ray.readOnlyRootFilesystem }}
- name: tmp
  emptyDir: {}
- name: cache
  emptyDir: {}
{{- end }}
{{- if .Values.app.ledger }}
{{ include "fairlane.ledger.spillVolume" . }}
{{- end }}
{{- end }}

{{/* Merges the ConfigMap's tenancy.yaml with the Secret's key hashes into the file the app reads. */}}
{{- define "fairlane.ray.initContainers" -}}
- name: tenancy-config
  image: {{ include "fairlane.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - python
    - /etc/fairlane/tenancy-src/merge_tenancy.py
    - --config
    - /etc/fairlane/tenancy-src/tenancy.yaml
    - --keys
    - /etc/fairlane/tenancy-keys/keys.yaml
    - --out
    - {{ include "fairlane.tenancy.path" . }}
  securityContext:
    {{- $sc := deepCopy .Values.ray.securityContext }}
    {{- $_ := set $sc "readOnlyRootFilesystem" true }}
    {{- toYaml $sc | nindent 4 }}
  resources:
    requests:
      cpu: 50m
      memory: 64Mi
    limits:
      cpu: 500m
      memory: 256Mi
  volumeMounts:
    - name: tenancy-src
      mountPath: /etc/fairlane/tenancy-src
      readOnly: true
    - name: tenancy-keys
      mountPath: /etc/fairlane/tenancy-keys
      readOnly: true
    - name: tenancy
      mountPath: /etc/fairlane/tenancy
{{- end }}

{{/* Pod-level fields of a Ray pod; the argument is a dict with "root" and "group" (head or gpuWorkers values). */}}
{{- define "fairlane.ray.podSpec" -}}
{{- $root := .root }}
{{- $g := .group }}
serviceAccountName: {{ include "fairlane.serviceAccountName" $root }}
automountServiceAccountToken: {{ $root.Values.serviceAccount.automountToken }}
securityContext:
  {{- toYaml $root.Values.ray.podSecurityContext | nindent 2 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $g.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $g.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $g.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
initContainers:
  {{- include "fairlane.ray.initContainers" $root | nindent 2 }}
volumes:
  {{- include "fairlane.ray.volumes" $root | nindent 2 }}
{{- end }}

{{/* Pod metadata of a Ray pod; same argument as fairlane.ray.podSpec, plus "component". */}}
{{- define "fairlane.ray.podMeta" -}}
{{- $root := .root }}
labels:
  {{- include "fairlane.selectorLabels" $root | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
  {{- with .group.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/tenancy: {{ include "fairlane.tenancy.public" $root | sha256sum }}
  checksum/tenant-keys: {{ toYaml $root.Values.tenancy.keys | sha256sum }}
  {{- with .group.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
