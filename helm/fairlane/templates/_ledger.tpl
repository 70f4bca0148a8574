{{/* The request ledger's database: the release's PostgreSQL, or an external one's DSN Secret. */}}

{{- define "fairlane.ledger.fullname" -}}
{{- printf "%s-ledger" (include "fairlane.fullname" .) }}
{{- end }}

{{/* The Secret holding the DSN; empty when the ledger has no PostgreSQL (each pod's SQLite file). */}}
{{- define "fairlane.ledger.secretName" -}}
{{- if .Values.ledger.postgresql.enabled }}
{{- include "fairlane.ledger.fullname" . }}
{{- else }}
{{- .Values.ledger.external.existingSecret }}
{{- end }}
{{- end }}

{{- define "fairlane.ledger.secretKey" -}}
{{- if .Values.ledger.postgresql.enabled }}dsn{{ else }}{{ .Values.ledger.external.existingSecretDsnKey }}{{ end }}
{{- end }}

{{/* The ledger's spill directory in every Ray pod (ledger.spill): the release's claim, an existing one,
a node directory or an emptyDir. */}}
{{- define "fairlane.ledger.spillClaim" -}}
{{- default (printf "%s-spill" (include "fairlane.ledger.fullname" .)) .Values.ledger.spill.pvc.existingClaim }}
{{- end }}

{{- define "fairlane.ledger.spillVolume" -}}
- name: ledger-spill
{{- if eq .Values.ledger.spill.volume "pvc" }}
  persistentVolumeClaim:
    claimName: {{ include "fairlane.ledger.spillClaim" . }}
{{- else if eq .Values.ledger.spill.volume "hostPath" }}
  hostPath:
    path: {{ .Values.ledger.spill.hostPath }}
    type: DirectoryOrCreate
{{- else }}
  emptyDir: {}
{{- end }}
{{- end }}
