"""The credential of a mesh's Monarch connections: a certificate authority (CA) of your own, whose key signs a
certificate for each process of the mesh, so that every connection between a session's controller and its workers
is mutual TLS (Monarch's ``tls://`` channel) between holders of that CA, and nobody else's.

    python -m forge_nb.launch.credentials new [DIR]      # or: forge-nb credentials new [DIR]
    python -m forge_nb.launch.credentials show [DIR]

A bundle is a folder of yours that nobody else may enter (0700) holding ``ca.crt``, the CA's certificate (public),
and ``ca.key``, its private key (0600). **ca.key is the secret**: whoever can read it can run code as you on every
worker that trusts the CA. DIR defaults to ``~/.forge_nb/credentials`` (`DEFAULT_DIR`), which ``mesh.credentials``
and the worker's ``--credentials`` default to, so on hosts that share your home folder making it once is all.

Each process that speaks Monarch over TLS (a host's worker, a session's controller) signs a certificate of its own
with the CA at its start (`Credentials.issue`: P-256, serverAuth and clientAuth, valid while the CA is) for every
name it may be dialled at (its address, its host name, each address of its host) and hands it to Monarch in its
environment (`Credentials.environment`): ``HYPERACTOR_TLS_CA``, ``_CERT`` and ``_KEY`` hold the PEM text itself, so
no key of a process is ever written to disk. Monarch then requires, on every connection, a certificate the CA signed
from the side that dials (the worker refuses anyone else before reading a message) and checks that the side dialled
holds one for the name it was dialled at. A Slurm session makes a bundle of its own for each job it submits
(`launch.slurm`), in the job's log folder, removed when the job is cancelled.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import ipaddress
import os
import socket
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from forge_nb.private_files import write_private

DEFAULT_DIR = "~/.forge_nb/credentials"
CA_CERT, CA_KEY = "ca.crt", "ca.key"
CA_DAYS = 365
SKEW = dt.timedelta(days=1)  # certificates are valid from a day before they are made: hosts' clocks differ
TLS_VARIABLES = ("HYPERACTOR_TLS_CA", "HYPERACTOR_TLS_CERT", "HYPERACTOR_TLS_KEY")


class CredentialsError(RuntimeError):
    """A bundle that is missing, unreadable, not private, or not a CA; the message says which and how to fix it."""


def _key_usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def private_folder(folder: Path) -> None:
    """`CredentialsError` unless `folder` is a folder of this user's that nobody else may enter."""
    try:
        info = folder.stat()
    except FileNotFoundError:
        raise CredentialsError(
            f"forge_nb: no credentials at {folder}; make them with `forge-nb credentials new {folder}` "
            "(or python -m forge_nb.launch.credentials new DIR) and give the folder to every worker"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise CredentialsError(f"forge_nb: credentials {folder} is not a folder")
    if info.st_uid != os.getuid():
        raise CredentialsError(f"forge_nb: credentials {folder} belong to uid {info.st_uid}, not to you; refusing them")
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise CredentialsError(
            f"forge_nb: others may enter the credentials folder {folder} (mode {stat.S_IMODE(info.st_mode):o}); "
            f"its CA key lets whoever reads it run code on your workers: `chmod 700 {folder}`, and make new ones "
            "if someone else could have read them"
        )


@dataclass(frozen=True)
class Credentials:
    """A CA: its certificate and private key, from the bundle at `folder`."""

    folder: Path
    ca_cert: x509.Certificate
    ca_key: ec.EllipticCurvePrivateKey

    @classmethod
    def new(cls, folder: str | Path, days: int = CA_DAYS, force: bool = False) -> Credentials:
        """A fresh CA, written to `folder` (made 0700; ``ca.key`` 0600). An existing bundle is kept unless `force`."""
        folder = Path(folder).expanduser()
        if (folder / CA_KEY).exists() and not force:
            raise CredentialsError(
                f"forge_nb: credentials already exist at {folder}; workers that trust them would refuse new ones "
                "(pass --force to replace them, then restart every worker with the new folder)"
            )
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        private_folder(folder)
        key = ec.generate_private_key(ec.SECP256R1())
        # A unique name: two CAs with one name make TLS report a bad signature instead of an unknown issuer.
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"forge_nb mesh CA {os.urandom(6).hex()}")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - SKEW)
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        write_private(folder / CA_KEY, _pem_key(key))
        write_private(folder / CA_CERT, cert.public_bytes(serialization.Encoding.PEM))
        return cls(folder, cert, key)

    @classmethod
    def load(cls, folder: str | Path | None = None) -> Credentials:
        """The bundle at `folder` (default `DEFAULT_DIR`), checked: this user's, private, a CA, not expired."""
        folder = Path(folder or DEFAULT_DIR).expanduser()
        private_folder(folder)
        key_path = folder / CA_KEY
        try:
            key_stat = key_path.stat()
            if key_stat.st_uid != os.getuid() or stat.S_IMODE(key_stat.st_mode) & 0o077:
                raise CredentialsError(
                    f"forge_nb: {key_path} must be yours and readable by you only (`chmod 600 {key_path}`)"
                )
            key = serialization.load_pem_private_key(key_path.read_bytes(), None)
            cert = x509.load_pem_x509_certificate((folder / CA_CERT).read_bytes())
        except FileNotFoundError as e:
            raise CredentialsError(
                f"forge_nb: {e.filename} is missing: {folder} is not a forge_nb credentials folder "
                f"(`forge-nb credentials new {folder}` makes one)"
            ) from None
        except ValueError as e:
            raise CredentialsError(f"forge_nb: the credentials at {folder} cannot be read: {e}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise CredentialsError(f"forge_nb: {key_path} is not the key of {folder / CA_CERT}")
        if not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
            raise CredentialsError(f"forge_nb: {folder / CA_CERT} is not a CA certificate")
        if cert.not_valid_after_utc <= dt.datetime.now(dt.UTC):
            raise CredentialsError(
                f"forge_nb: the credentials at {folder} expired on {cert.not_valid_after_utc:%Y-%m-%d}; make new ones "
                f"(`forge-nb credentials new --force {folder}`) and restart the workers with them"
            )
        return cls(folder, cert, key)

    @property
    def fingerprint(self) -> str:
        """The CA certificate's SHA-256, short: the same on every host that holds this bundle."""
        digest = hashlib.sha256(self.ca_cert.public_bytes(serialization.Encoding.DER)).hexdigest()
        return ":".join(digest[i : i + 2] for i in range(0, 16, 2))

    def issue(self, names: list[str]) -> tuple[bytes, bytes]:
        """A certificate for `names` (addresses or host names), signed by the CA -> (its PEM, its key's PEM)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        sans: list[x509.GeneralName] = []
        for name in dict.fromkeys(names):
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"forge_nb {names[0]}")]))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - SKEW)
            .not_valid_after(self.ca_cert.not_valid_after_utc)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(self.ca_key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)

    def environment(self, address: str) -> dict[str, str]:
        """What Monarch reads for a process dialled at `address` (a host or an IP): the CA and a certificate of
        its own for that name and every other name of this host (`host_names`), as PEM text."""
        cert, key = self.issue(host_names(address))
        ca = self.ca_cert.public_bytes(serialization.Encoding.PEM)
        return dict(zip(TLS_VARIABLES, (ca.decode(), cert.decode(), key.decode())))

    def use(self, address: str) -> None:
        """Make this process speak Monarch's TLS as a holder of this CA, dialled at `address` (`environment`).
        Monarch reads its configuration from the environment when it is first imported: if it already was (a
        session's server imports it before its mesh starts), it reads it again now."""
        os.environ.update(self.environment(address))
        if "monarch" in sys.modules:
            from monarch._rust_bindings.monarch_hyperactor.config import reload_config_from_env

            reload_config_from_env()


def host_names(address: str) -> list[str]:
    """`address` first, then the names this host may be dialled at: its host name (short and qualified), every
    address of its interfaces, and loopback."""
    import psutil

    names = [address, socket.gethostname(), socket.getfqdn(), "localhost"]
    for addrs in psutil.net_if_addrs().values():
        names += [a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
    return [n for n in dict.fromkeys(names) if n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="forge-nb credentials",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    new = verbs.add_parser("new", help="make a CA bundle (ca.crt, ca.key) in DIR")
    new.add_argument("dir", nargs="?", default=DEFAULT_DIR, help=f"the bundle's folder (default {DEFAULT_DIR})")
    new.add_argument("--days", type=int, default=CA_DAYS, help=f"how long it is valid (default {CA_DAYS})")
    new.add_argument("--force", action="store_true", help="replace the bundle already there")
    show = verbs.add_parser("show", help="check the bundle in DIR and print its fingerprint and expiry")
    show.add_argument("dir", nargs="?", default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    try:
        if args.verb == "new":
            made = Credentials.new(args.dir, args.days, args.force)
            until = f"{made.ca_cert.not_valid_after_utc:%Y-%m-%d}"
            print(f"forge_nb credentials in {made.folder}: CA {made.fingerprint}, valid until {until}")
            print(f"Keep {made.folder / CA_KEY} secret: whoever reads it can run code as you on your workers.")
            print(f"Each worker: python -m forge_nb.launch.worker tls://ADDRESS:PORT --credentials {made.folder}")
        else:
            found = Credentials.load(args.dir)
            until = f"{found.ca_cert.not_valid_after_utc:%Y-%m-%d}"
            print(f"forge_nb credentials in {found.folder}: CA {found.fingerprint}, valid until {until}; ok")
    except CredentialsError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
