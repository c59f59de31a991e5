"""The daemon's HTTP side: ``server`` (the FastAPI app: /metrics, probes, /v1/...), ``exposition`` (the
/metrics renderer), ``listen`` (addresses and sockets), and access to the listener configured by a Prometheus
exporter-toolkit ``web-config.yml`` (``--web-config``): ``webconfig`` (the file), ``tls`` (the TLS context)
and ``guard`` (basic auth, response headers, rate limit, reload)."""
