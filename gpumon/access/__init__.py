"""Access to the daemon's HTTP listener: TLS, basic auth, response headers and a rate limit, configured by a
Prometheus exporter-toolkit ``web-config.yml`` (``--web-config``)."""
