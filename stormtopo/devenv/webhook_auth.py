"""The local API server authenticates itself to admission webhooks with a client certificate.

kube-apiserver presents one when its AdmissionConfiguration (`--admission-control-config-file`) gives
the webhook admission plugins a kubeConfigFile whose user matches the webhook's host. The operator,
given that certificate's CA (webhook.CLIENT_CA_ENV), then answers the StormService gate only for the
API server: a review made up by anyone else on the network is refused (README, "When things fail").
"""

from __future__ import annotations

import datetime
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from stormtopo import certificates

CLIENT_CA = "webhook-client-ca.crt"  # in DIR/pki: what the operator trusts
CLIENT_CERT = "webhook-client.crt"  # what kube-apiserver presents to webhooks
CLIENT_KEY = "webhook-client.key"
ADMISSION_CONFIG = "admission-config.yaml"
WEBHOOK_KUBECONFIG = "webhook-client.kubeconfig"
COMMON_NAME = "kube-apiserver-webhook-client"


def new_client_cert(ca: certificates.KeyPair, common_name: str) -> certificates.KeyPair:
    """A TLS client certificate signed by `ca` (extended key usage clientAuth: a server verifying
    clients refuses a serving certificate)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return certificates.KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def write(pki: Path) -> Path:
    """Write a client CA, the API server's client certificate, the kubeconfig naming it for every
    webhook host ('*'), and the AdmissionConfiguration; return the configuration's path."""
    ca = certificates.new_ca("stormtopo-webhook-client-ca")
    client = new_client_cert(ca, COMMON_NAME)
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
