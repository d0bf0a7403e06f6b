"""Throwaway TLS certificates made with the openssl command line (the test skips without it)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def make_certificates(directory: Path) -> dict[str, Path]:
    """A CA and a server certificate for localhost/127.0.0.1 signed by it, plus an unrelated CA."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    names = ("ca", "ca_key", "other_ca", "other_key", "cert", "key", "csr")
    paths = {name: directory / f"{name}.pem" for name in names}

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    for ca, key in (("ca", "ca_key"), ("other_ca", "other_key")):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=genfleet test {ca}",
            "-keyout", str(paths[key]), "-out", str(paths[ca]))
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", str(paths["key"]),
        "-out", str(paths["csr"]))
    extensions = directory / "san.ext"
    extensions.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", str(paths["csr"]), "-CA", str(paths["ca"]), "-CAkey", str(paths["ca_key"]),
        "-CAcreateserial", "-days", "2", "-extfile", str(extensions), "-out", str(paths["cert"]))
    return paths
