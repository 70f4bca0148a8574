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
