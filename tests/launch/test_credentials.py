"""The mesh's credentials (`forge_nb.launch.credentials`): a CA bundle only its owner can open, refused when it is
not private, expired or not a CA; each process's certificate signed by it, for every name it may be dialled at,
for both ends of a TLS connection; and the worker's command line, which says what to keep secret."""

from __future__ import annotations

import datetime as dt
import os
import stat
import subprocess
import sys

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from forge_nb.launch import credentials as module
from forge_nb.launch.credentials import TLS_VARIABLES, Credentials, CredentialsError, host_names


def test_a_new_bundle_is_private_and_is_not_replaced_by_accident(tmp_path):
    made = Credentials.new(tmp_path / "creds")
    folder = made.folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "ca.key").stat().st_mode) == 0o600
    assert sorted(p.name for p in folder.iterdir()) == ["ca.crt", "ca.key"]
    assert Credentials.load(folder).fingerprint == made.fingerprint
    with pytest.raises(CredentialsError, match="already exist"):
        Credentials.new(folder)
    assert Credentials.new(folder, force=True).fingerprint != made.fingerprint


def test_a_bundle_others_could_read_or_that_is_not_yours_is_refused(tmp_path):
    folder = Credentials.new(tmp_path / "creds").folder
    os.chmod(folder, 0o755)
    with pytest.raises(CredentialsError, match="others may enter.*chmod 700"):
        Credentials.load(folder)
    os.chmod(folder, 0o700)
    os.chmod(folder / "ca.key", 0o644)
    with pytest.raises(CredentialsError, match="chmod 600"):
        Credentials.load(folder)
    os.chmod(folder / "ca.key", 0o600)
    if os.getuid() == 0:  # root can hand the folder to someone else
        os.chown(folder, 65534, -1)
        with pytest.raises(CredentialsError, match="belong to uid 65534"):
            Credentials.load(folder)
        os.chown(folder, 0, -1)
    with pytest.raises(CredentialsError, match="no credentials at .*forge-nb credentials new"):
        Credentials.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir(mode=0o700)
    with pytest.raises(CredentialsError, match="is missing"):
        Credentials.load(tmp_path / "empty")
    expired = Credentials.new(tmp_path / "old", days=-1).folder
    with pytest.raises(CredentialsError, match="expired"):
        Credentials.load(expired)


def test_a_process_certificate_is_signed_by_the_ca_for_every_name_it_is_dialled_at(tmp_path):
    ca = Credentials.new(tmp_path / "creds")
    cert_pem, key_pem = ca.issue(["10.0.0.7", "node7"])
    cert = x509.load_pem_x509_certificate(cert_pem)
    cert.verify_directly_issued_by(ca.ca_cert)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert names.get_values_for_type(x509.DNSName) == ["node7"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.not_valid_after_utc == ca.ca_cert.not_valid_after_utc
    assert cert.not_valid_before_utc < dt.datetime.now(dt.UTC) - dt.timedelta(hours=23)  # clocks differ
    assert b"PRIVATE KEY" in key_pem
    env = ca.environment("10.0.0.7")
    assert list(env) == list(TLS_VARIABLES) and all(v.startswith("-----BEGIN") for v in env.values())
    assert host_names("10.0.0.7")[0] == "10.0.0.7" and "127.0.0.1" in host_names("x")


def test_the_command_line_makes_and_checks_a_bundle_and_says_what_to_keep_secret(tmp_path, capsys):
    folder = tmp_path / "creds"
    assert module.main(["new", str(folder)]) == 0
    said = capsys.readouterr().out
    assert f"Keep {folder / 'ca.key'} secret" in said and "--credentials" in said
    assert module.main(["show", str(folder)]) == 0 and "ok" in capsys.readouterr().out
    os.chmod(folder, 0o750)
    assert module.main(["show", str(folder)]) == 1 and "others may enter" in capsys.readouterr().err


def test_the_workers_help_says_what_to_keep_secret_and_a_tcp_address_is_refused(tmp_path):
    run = [sys.executable, "-m", "forge_nb.launch.worker"]
    help_text = subprocess.run([*run, "--help"], capture_output=True, text=True, check=True).stdout
    assert "ca.key" in help_text and "secret" in help_text and "~/.forge_nb/credentials" in help_text
    refused = subprocess.run([*run, "tcp://127.0.0.1:26999"], capture_output=True, text=True)
    assert refused.returncode != 0 and "tls:// only" in refused.stderr
    no_bundle = subprocess.run([*run, "tls://127.0.0.1:26999", "--credentials", str(tmp_path / "no")], text=True,
                               capture_output=True)  # fmt: skip
    assert no_bundle.returncode != 0 and "forge-nb credentials new" in no_bundle.stderr
