{{- define "aether-edge.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "aether-edge.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "aether-edge.podMonitorLabels" -}}
aether.io/edge: {{ include "aether-edge.fullname" . }}
{{- end -}}

{{- define "aether-edge.labels" -}}
{{ include "aether-edge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: aether
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
Whole seconds (rounded up) in a duration such as "30s", "2m", "1m30s", "1h" or
"500ms": the grace period is derived from them. Units h, m, s and ms, alone or
combined in that order, as the binary's --drain-delay/--drain-timeout take them; a
bare 0 is zero. Anything else fails the render rather than guess a shorter period.
*/}}
{{- define "aether-edge.seconds" -}}
{{- $d := . | toString | trim -}}
{{- if eq $d "0" -}}0
{{- else if not (regexMatch "^([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$" $d) -}}
{{- fail (printf "durations must be whole h, m, s and ms, such as 30s, 2m, 1m30s or 500ms: %q" $d) -}}
{{- else if eq $d "" -}}
{{- fail "a duration must not be empty" -}}
{{- else -}}
{{- $ms := 0 -}}
{{- range regexFindAll "[0-9]+(ms|h|m|s)" $d -1 -}}
{{- $n := regexFind "^[0-9]+" . | int64 -}}
{{- $unit := trimPrefix (regexFind "^[0-9]+" .) . -}}
{{- $scale := get (dict "h" 3600000 "m" 60000 "s" 1000 "ms" 1) $unit | int64 -}}
{{- $ms = add $ms (mul $n $scale) -}}
{{- end -}}
{{- div (add $ms 999) 1000 -}}
{{- end -}}
{{- end -}}

{{/* Dedicated Gateways need per-Gateway addressing: their Service is what moves to their own pods. */}}
{{- define "aether-edge.dedicated" -}}
{{- if and .Values.dedicated.enabled .Values.perGatewayAddressing -}}true{{- end -}}
{{- end -}}

{{/*
The edge pod, used by the edge Deployment and, through the -dedicated ConfigMap, as
the template of dedicated Gateways' Deployments (the controller relabels it and adds
--serve-gateway), so both kinds of pods run the same way.
*/}}
{{- define "aether-edge.podTemplate" -}}
metadata:
  labels:
    {{- include "aether-edge.selectorLabels" . | nindent 4 }}
    # Kept by dedicated Gateways' pods (the controller drops app.kubernetes.io/*), so
    # the PodMonitor finds every edge pod of the release.
    {{- include "aether-edge.podMonitorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ .Values.adminPort | quote }}
    prometheus.io/path: /metrics
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "aether-edge.fullname" . }}
  automountServiceAccountToken: true
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  # The drain runs inside the process (readiness fails for drainDelay, then
  # in-flight requests get drainTimeout); the kubelet must not kill it sooner.
  terminationGracePeriodSeconds: {{ add (include "aether-edge.seconds" .Values.drainDelay | int) (include "aether-edge.seconds" .Values.drainTimeout | int) 5 }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: edge
      image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - run
        - --kubernetes
        - --controller-name={{ .Values.gatewayClass.controllerName }}
        - --internal-port-range={{ .Values.internalPortRange }}
        {{- if not .Values.perGatewayAddressing }}
        - --per-gateway-addressing=false
        {{- end }}
        - --edge-service={{ .Release.Namespace }}/{{ include "aether-edge.fullname" . }}
        - --admin=0.0.0.0:{{ .Values.adminPort }}
        - --drain-delay={{ .Values.drainDelay }}
        - --drain-timeout={{ .Values.drainTimeout }}
        {{- if .Values.mesh.enabled }}
        - --mesh
        - --mesh-port={{ .Values.mesh.inboundPort }}
        - --spiffe-socket=unix:///run/spire/agent-sockets/{{ .Values.mesh.spireSocketName }}
        {{- end }}
        {{- if include "aether-edge.dedicated" . }}
        - --dedicated-pod-template=/etc/aether-edge/dedicated/pod-template.yaml
        {{- end }}
        {{- range .Values.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        - name: RUST_LOG
          value: {{ .Values.logLevel | quote }}
        # The replica's name in the writer Lease.
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
      ports:
        - name: admin
          containerPort: {{ .Values.adminPort }}
          protocol: TCP
      readinessProbe:
        httpGet:
          path: /readyz
          port: admin
        periodSeconds: 2
        failureThreshold: 1
      livenessProbe:
        httpGet:
          path: /livez
          port: admin
        periodSeconds: 10
        failureThreshold: 3
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      {{- if or .Values.mesh.enabled (include "aether-edge.dedicated" .) }}
      volumeMounts:
        {{- if .Values.mesh.enabled }}
        - name: spire-agent-socket
          mountPath: /run/spire/agent-sockets
          readOnly: true
        {{- end }}
        {{- if include "aether-edge.dedicated" . }}
        - name: dedicated-pod-template
          mountPath: /etc/aether-edge/dedicated
          readOnly: true
        {{- end }}
      {{- end }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: ["ALL"]
  {{- if or .Values.mesh.enabled (include "aether-edge.dedicated" .) }}
  volumes:
    {{- if .Values.mesh.enabled }}
    - name: spire-agent-socket
      hostPath:
        path: {{ .Values.mesh.spireSocketDir }}
        type: Directory
    {{- end }}
    {{- if include "aether-edge.dedicated" . }}
    - name: dedicated-pod-template
      configMap:
        name: {{ include "aether-edge.fullname" . }}-dedicated
    {{- end }}
  {{- end }}
  {{- if .Values.topologySpread.enabled }}
  topologySpreadConstraints:
    - maxSkew: {{ .Values.topologySpread.maxSkew }}
      topologyKey: kubernetes.io/hostname
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "aether-edge.selectorLabels" . | nindent 10 }}
    - maxSkew: {{ .Values.topologySpread.maxSkew }}
      topologyKey: topology.kubernetes.io/zone
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "aether-edge.selectorLabels" . | nindent 10 }}
  {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
