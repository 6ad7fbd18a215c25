{{/* Names and labels: one definition each, used by every template. */}}

{{- define "dlaas.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dlaas.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "dlaas.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "dlaas.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The labels every object carries. */}}
{{- define "dlaas.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "dlaas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dlaas
{{- end }}

{{/* Selector labels of one component; call with (dict "root" $ "component" "api"). */}}
{{- define "dlaas.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dlaas.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "dlaas.imageTag" -}}
{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The platform image: <prefix>platform:<tag>, as the Kubernetes backend names it for
the learners' fetch and store steps. */}}
{{- define "dlaas.image" -}}
{{ .Values.image.prefix }}platform:{{ include "dlaas.imageTag" . }}
{{- end }}

{{- define "dlaas.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "dlaas.fullname" .)) }}
{{- end }}

{{- /* The platform's components (API, scoring, migrations): bound to no Role. */}}
{{- define "dlaas.serviceAccountName" -}}
{{- include "dlaas.fullname" . }}
{{- end }}

{{- /* The Kubernetes backend's (worker, monitor): the learners' Role of rbac.yaml. */}}
{{- define "dlaas.backendServiceAccountName" -}}
{{- printf "%s-backend" (include "dlaas.fullname" .) }}
{{- end }}

{{- define "dlaas.postgresqlHost" -}}
{{- printf "%s-postgresql" (include "dlaas.fullname" .) }}
{{- end }}

{{- define "dlaas.redisHost" -}}
{{- printf "%s-redis" (include "dlaas.fullname" .) }}
{{- end }}

{{- define "dlaas.minioHost" -}}
{{- printf "%s-minio" (include "dlaas.fullname" .) }}
{{- end }}

{{- define "dlaas.s3Endpoint" -}}
{{- if .Values.s3.bundled }}
{{- printf "http://%s:9000" (include "dlaas.minioHost" .) }}
{{- else }}
{{- required "s3.endpoint is required when s3.bundled is false" .Values.s3.endpoint }}
{{- end }}
{{- end }}

{{/* Settings every platform container shares: the non-secret ones as values, the secret
ones from the Secret. */}}
{{- define "dlaas.env" -}}
# A directory the process makes (0700) inside the scratch volume.
- name: DLAAS_HOME
  value: /var/lib/dlaas/home
- name: DLAAS_CATALOG_FILE
  value: /etc/dlaas/catalog.yaml
- name: DLAAS_AUTO_MIGRATE
  value: {{ (not .Values.migrations.enabled) | quote }}
- name: DLAAS_BACKEND
  value: kubernetes
- name: DLAAS_K8S_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: DLAAS_K8S_IMAGE_PREFIX
  value: {{ .Values.image.prefix | quote }}
- name: DLAAS_K8S_IMAGE_TAG
  value: {{ include "dlaas.imageTag" . | quote }}
- name: DLAAS_K8S_IMAGE_PULL_SECRETS
  value: {{ join "," .Values.imagePullSecrets | quote }}
- name: DLAAS_K8S_GPU_RESOURCE
  value: {{ .Values.learners.gpuResource | quote }}
- name: DLAAS_K8S_CLUSTER_DOMAIN
  value: {{ .Values.learners.clusterDomain | quote }}
- name: DLAAS_K8S_POD_TTL_SECONDS
  value: {{ .Values.learners.podTtlSeconds | quote }}
- name: DLAAS_K8S_GANG
  value: {{ .Values.learners.gang.scheduler | quote }}
- name: DLAAS_K8S_KUEUE_QUEUE
  value: {{ .Values.learners.gang.kueueQueue | quote }}
- name: DLAAS_K8S_SCHEDULER_NAME
  value: {{ .Values.learners.gang.schedulerName | quote }}
- name: DLAAS_K8S_UNSCHEDULABLE_SECONDS
  value: {{ .Values.learners.gang.unschedulableSeconds | quote }}
{{- include "dlaas.networkPolicyEnv" . }}
- name: DLAAS_S3_ENDPOINT
  value: {{ include "dlaas.s3Endpoint" . | quote }}
- name: DLAAS_S3_BUCKET
  value: {{ .Values.s3.bucket | quote }}
{{- with .Values.s3.region }}
- name: DLAAS_S3_REGION
  value: {{ . | quote }}
{{- end }}
{{- with .Values.s3.roleArn }}
- name: DLAAS_STORE_ROLE_ARN
  value: {{ . | quote }}
{{- end }}
{{- if .Values.s3.allowPlatformStoreCredentials }}
- name: DLAAS_K8S_ALLOW_PLATFORM_STORE_CREDENTIALS
  value: "true"
{{- end }}
- name: DLAAS_STORE_SESSION_MAX_SECONDS
  value: {{ .Values.s3.sessionMaxSeconds | quote }}
{{- with .Values.allowedDataEndpoints }}
- name: DLAAS_ALLOWED_DATA_ENDPOINTS
  value: {{ . | quote }}
{{- end }}
{{- if .Values.scoring.enabled }}
- name: DLAAS_SCORING_URL
  value: {{ printf "http://%s-scoring:%v" (include "dlaas.fullname" .) .Values.scoring.port | quote }}
{{- end }}
{{- range $key := list "DLAAS_ADMIN_API_KEY" "DLAAS_SECRET_KEY" "DLAAS_DATABASE_URL" "DLAAS_BROKER_URL" "DLAAS_S3_ACCESS_KEY" "DLAAS_S3_SECRET_KEY" }}
- name: {{ $key }}
  valueFrom:
    secretKeyRef:
      name: {{ include "dlaas.secretName" $ }}
      key: {{ $key }}
{{- end }}
{{- range $name, $value := .Values.extraEnv }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}

{{/* The writable scratch volumes of a read-only root filesystem, and the catalog. */}}
{{- define "dlaas.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.scratchSizeLimit }}
- name: home
  emptyDir:
    sizeLimit: {{ .Values.scratchSizeLimit }}
- name: catalog
  configMap:
    name: {{ include "dlaas.fullname" . }}-catalog
{{- end }}

{{- define "dlaas.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /var/lib/dlaas
- name: catalog
  mountPath: /etc/dlaas
  readOnly: true
{{- end }}

{{/* What every platform pod spec starts with. */}}
{{- define "dlaas.podCommon" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Node selector, tolerations and affinity of one component's values. */}}
{{- define "dlaas.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Each training's NetworkPolicy (DLAAS_K8S_NETWORK_POLICY, DLAAS_K8S_EGRESS_*): the
bundled Redis and MinIO are the learners' log store and store, so they are egress too. */}}
{{- define "dlaas.networkPolicyEnv" -}}
{{- $np := .Values.networkPolicy }}
{{- $pods := list }}
{{- $ports := list }}
{{- if .Values.redis.bundled }}
{{- $pods = append $pods (printf "app.kubernetes.io/instance=%s,app.kubernetes.io/component=redis" .Release.Name) }}
{{- $ports = append $ports 6379 }}
{{- end }}
{{- if .Values.s3.bundled }}
{{- $pods = append $pods (printf "app.kubernetes.io/instance=%s,app.kubernetes.io/component=minio" .Release.Name) }}
{{- $ports = append $ports 9000 }}
{{- end }}
- name: DLAAS_K8S_NETWORK_POLICY
  value: {{ $np.enabled | quote }}
{{- if $np.enabled }}
- name: DLAAS_K8S_EGRESS_CIDRS
  value: {{ join "," $np.egressCIDRs | quote }}
- name: DLAAS_K8S_EGRESS_PODS
  value: {{ join ";" (concat $pods $np.egressPods) | quote }}
- name: DLAAS_K8S_EGRESS_PORTS
  value: {{ ternary "" (join "," (concat $np.egressPorts $ports)) (empty $np.egressPorts) | quote }}
- name: DLAAS_K8S_EGRESS_DENIED_CIDRS
  value: {{ join "," $np.deniedCIDRs | quote }}
{{- end }}
{{- end }}

{{/* The pods of the platform's own components (all but learners) of this release. */}}
{{- define "dlaas.platformPeers" -}}
- podSelector:
    matchLabels:
      app.kubernetes.io/name: {{ include "dlaas.name" . }}
      app.kubernetes.io/instance: {{ .Release.Name }}
    matchExpressions:
      - key: app.kubernetes.io/component
        operator: In
        values: [api, worker, monitor, scoring, migrations]
{{- end }}

{{/* The learners' pods: every pod the Kubernetes backend creates carries this label. */}}
{{- define "dlaas.learnerPeers" -}}
- podSelector:
    matchExpressions:
      - key: dlaas.io/training-id
        operator: Exists
{{- end }}
