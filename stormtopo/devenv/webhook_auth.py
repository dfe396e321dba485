"""The local API server authenticates itself to admission webhooks with a client certificate.

kube-apiserver presents one when its AdmissionConfiguration (`--admission-control-config-file`) gives
the webhook admission plugins a kubeConfigFile whose user matches the webhook's host. The operator,
given that certificate's CA (webhook.CLIENT_CA_ENV), then answers the StormService gate only for the
API server: a review made up by anyone else on the network is refused (docs/security.md).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from stormtopo import certificates

CLIENT_CA = "webhook-client-ca.crt"  # in DIR/pki: what the operator trusts
CLIENT_CERT = "webhook-client.crt"  # what kube-apiserver presents to webhooks
CLIENT_KEY = "webhook-client.key"
ADMISSION_CONFIG = "admission-config.yaml"
WEBHOOK_KUBECONFIG = "webhook-client.kubeconfig"
COMMON_NAME = "kube-apiserver-webhook-client"


def write(pki: Path) -> Path:
    """Write a client CA, the API server's client certificate, the kubeconfig naming it for every
    webhook host ('*'), and the AdmissionConfiguration; return the configuration's path."""
    ca = certificates.new_ca("stormtopo-webhook-client-ca")
    client = certificates.new_client_cert(ca, COMMON_NAME)
    for name, data in ((CLIENT_CA, ca.cert_pem), (CLIENT_CERT, client.cert_pem), (CLIENT_KEY, client.key_pem)):
        (pki / name).write_bytes(data)
        (pki / name).chmod(0o600)
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "users": [{"name": "*", "user": {"client-certificate": str(pki / CLIENT_CERT), "client-key": str(pki / CLIENT_KEY)}}],
    }
    (pki / WEBHOOK_KUBECONFIG).write_text(yaml.safe_dump(kubeconfig))
    plugin = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(pki / WEBHOOK_KUBECONFIG),
    }
    config = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [{"name": name, "configuration": plugin} for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")],
    }
    (pki / ADMISSION_CONFIG).write_text(yaml.safe_dump(config))
    return pki / ADMISSION_CONFIG


def client_ca(state_dir: Path) -> Path | None:
    """The client CA of a cluster `dev up` started, if it made one (older state directories did not)."""
    path = state_dir / "pki" / CLIENT_CA
    return path if path.exists() else None
