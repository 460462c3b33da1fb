# A real Prometheus server and promtool for the metrics tests (issue 20):
# promtool checks every /metrics exposition and the example scrape config,
# and the e2e test starts its own server on a loopback port. Debian's
# package may also enable a system service on :9090; the tests never use
# it.
need_apt prometheus
